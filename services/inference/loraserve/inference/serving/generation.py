"""Generate as domain logic: validate, admit, lease an adapter revision, stream deltas.

Tokens are passed on as the engine produces them, never buffered. If the consumer
goes away (client cancel, deadline), the engine request is aborted at once by
closing the engine stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from loraserve.common.errors import InvalidArgument, LoraserveError, Unavailable
from loraserve.common.revisions.names import AdapterRef, parse_adapter_ref
from loraserve.common.tracing import TracingSettings
from loraserve.inference.adapters import AdapterRegistry, Lease
from loraserve.inference.engine import (
    Engine,
    EngineFinish,
    SamplingRequest,
    SamplingSpec,
    check_limits,
)
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving.admission import Admission
from loraserve.inference.serving.chunks import (
    FINISH_REASONS,
    FinishReason,
    GenerationChunk,
    Outcome,
    Usage,
)
from loraserve.inference.serving.fairness import FairGate
from loraserve.inference.serving.pushed import ChunkWriter, Push, PushedStream, pushable
from loraserve.inference.serving.quotas import QuotaGate
from loraserve.inference.serving.slots import SlotGate
from loraserve.inference.serving.spans import GenerateSpans, RequestTrace, TraceOrigin

__all__ = [
    "FinishReason",
    "GenerateCommand",
    "GenerationChunk",
    "Generator",
    "SamplingRequest",
    "Usage",
]

log = logging.getLogger(__name__)

MAX_REQUEST_ID_CHARS = 128
_UNRESOLVED_ADAPTER = "_unresolved"


@dataclass(frozen=True)
class GenerateCommand:
    """One Generate call; exactly one of the prompt fields is set by a valid caller."""

    adapter: str
    prompt_text: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingRequest = field(default_factory=SamplingRequest)
    request_id: str = ""
    # Picks the arm of a rollout of the adapter (a principal, say); "" spreads requests.
    rollout_key: str = ""
    # Tells callers apart in a rollout's count of distinct callers (adapters.rollouts).
    rollout_caller: str = ""
    # A prompt rendered only once the request is admitted (a chat template), in place
    # of the prompt fields: a request refused at the door costs no rendering.
    render_prompt: Callable[[], Awaitable[Sequence[int]]] | None = None
    # The caller's trace context and the front's attributes, for the request's span;
    # None: a span of its own, under whatever span is current.
    origin: TraceOrigin | None = None


def _log_started(request_id: str, lease: Lease, prompt_tokens: int, traced: RequestTrace) -> None:
    with traced.current():
        log.info(
            "generate.started request_id=%s adapter=%s rev=%d prompt_tokens=%d",
            request_id,
            lease.name,
            lease.revision,
            prompt_tokens,
        )


def _log_finished(
    request_id: str, finish: FinishReason, generated: int, traced: RequestTrace
) -> None:
    traced.finished(finish)
    with traced.current():
        log.info(
            "generate.finished request_id=%s reason=%s completion_tokens=%d",
            request_id,
            finish.value,
            generated,
        )


def _failure_code(exc: BaseException, request_id: str) -> str:
    """The code a failed request is counted, and its span ended, with."""
    if isinstance(exc, LoraserveError):
        return exc.code.name
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        log.info("generate.cancelled request_id=%s", request_id)
        return "CANCELLED"
    # A bug: the fronts answer INTERNAL, and so must the count.
    return "INTERNAL"


def server_request_id(client_id: str) -> str:
    """A request id unique in this server; the client's id, if any, stays readable in it."""
    if len(client_id) > MAX_REQUEST_ID_CHARS or not client_id.isprintable():
        raise InvalidArgument(
            f"request_id must be printable and at most {MAX_REQUEST_ID_CHARS} characters"
        )
    suffix = uuid.uuid4().hex
    # The engine keys requests by id: two clients reusing one id must not collide there.
    return f"{client_id}-{suffix[:12]}" if client_id else suffix


class Generator:
    """Runs Generate calls against one engine and adapter registry."""

    def __init__(
        self,
        engine: Engine,
        registry: AdapterRegistry,
        admission: Admission,
        metrics: InferenceMetrics,
        gate: FairGate | None = None,
        slots: SlotGate | None = None,
        quotas: QuotaGate | None = None,
        push: Push | None = None,
        tracing: TracingSettings | None = None,
    ) -> None:
        """`tracing`: whether requests are traced (its endpoint), and with whose names."""
        self._engine = engine
        # The engine's pushed outputs (engine.pushed); None: every stream is pulled.
        self._push = push
        self._registry = registry
        self._admission = admission
        self._metrics = metrics
        # Fair admission into the engine; None: every admitted request goes straight in.
        self._gate = gate
        # LoRA slots in turn, past the fair gate; None: vLLM orders adapters into them.
        self._slots = slots
        # Per-adapter quotas, checked before anything else is admitted.
        self._quotas = quotas if quotas is not None else QuotaGate()
        self._spans = GenerateSpans(tracing)

    async def generate(
        self, command: GenerateCommand, write: ChunkWriter | None = None
    ) -> AsyncGenerator[GenerationChunk, None]:
        """Streams the generation; raises domain errors before or during the stream. With
        `write`, a request the engine can push (`pushed.pushable`) goes there from the
        engine's output handler, and nothing is yielded."""
        check_limits(command.sampling)
        ref = parse_adapter_ref(command.adapter)
        request_id = server_request_id(command.request_id)
        traced = self._spans.start(command.origin, command.adapter, request_id)
        adapter_label = _UNRESOLVED_ADAPTER
        code = "OK"
        error: BaseException | None = None
        outcome = Outcome()
        sequences = command.sampling.n or 1
        try:
            with self._admitted(ref, sequences, outcome) as admitted:
                prompt_ids = await self._prompt_ids(command)
                spec = self._engine.sampling(command.sampling, len(prompt_ids))
                # The turn before the lease: a request waiting for its turn pins no
                # adapter in the engine. Names made up by a client take turns as one,
                # so they cannot dilute every real adapter's fair share.
                async with (
                    traced.waiting("gate", self._turn(self._routed_label(ref), sequences)),
                    traced.waiting(
                        "adapter", self._registry.acquire(ref, command.rollout_key)
                    ) as lease,
                ):
                    adapter_label, outcome.revision = lease.name, lease.revision
                    traced.leased(lease, ref, self._registry.split_of, len(prompt_ids))
                    _log_started(request_id, lease, len(prompt_ids), traced)
                    outcome.charge(len(prompt_ids))  # its prefill, as it goes in
                    if write is not None and self._push is not None and pushable(spec):
                        await self._pushed(
                            request_id, prompt_ids, spec, lease, admitted, outcome, write, traced
                        )
                        return
                    # aclosing: an async for does not close what it iterates when the
                    # consumer closes us, and the engine request must end right then.
                    chunks = self._stream(request_id, prompt_ids, spec, lease, outcome, traced)
                    async with contextlib.aclosing(chunks):
                        async for chunk in chunks:
                            yield chunk
        except (Exception, asyncio.CancelledError, GeneratorExit) as exc:
            code, error = _failure_code(exc, request_id), exc
            raise
        finally:
            self._count(command, ref, adapter_label, code, outcome)
            traced.end(code, outcome, error)

    def _count(
        self, command: GenerateCommand, ref: AdapterRef, label: str, code: str, outcome: Outcome
    ) -> None:
        """Counts a finished request, and what it came to on its revision."""
        self._metrics.request_finished(label, code)
        if outcome.revision:
            self._metrics.revision_finished(
                label,
                outcome.revision,
                code,
                outcome.engine_ttft_s,
                outcome.generated,
                caller=command.rollout_caller,
                split=ref.revision is None,
            )

    @contextlib.contextmanager
    def _admitted(self, ref: AdapterRef, sequences: int, outcome: Outcome) -> Iterator[float]:
        """Holds the request's place under its adapter's quota and in admission, weighed
        as the `sequences` (its n) the engine runs for it; sets what charges its tokens
        (prompt and generated: the prefill is work as decoding is) on `outcome`. Yields
        when it was admitted (time.monotonic); counts the tokens it generated, where
        routing reads how long its adapter's sequences run."""
        label = self._routed_label(ref)
        with (
            self._quotas.admit(ref.name, label, sequences) as charge,
            self._admission.admit(sequences, label),
        ):
            outcome.charge = charge
            outcome.admitted = time.monotonic()
            try:
                yield outcome.admitted
            finally:
                # One that generated nothing (refused, aborted in the engine's queue)
                # held no step: counted, an overloaded adapter whose callers give up
                # would read shorter just when it is too hot.
                if outcome.generated:
                    self._admission.ran(label, sequences, outcome.generated)

    def _routed_label(self, ref: AdapterRef) -> str:
        """The name when this replica routes it ("" for the base model), else one label
        for every other name (NOT_FOUND next), so names a client makes up cannot grow
        the quotas' table or the fair gate's, nor share the base model's count."""
        name = ref.name
        if ref.is_base:
            return name
        routed = self._registry.target_revision(name) or self._registry.current_revision(name)
        return name if routed else _UNRESOLVED_ADAPTER

    @contextlib.asynccontextmanager
    async def _turn(self, adapter: str, sequences: int) -> AsyncIterator[None]:
        """The request's turn into the engine: its places by the fair gate, then its
        adapter's LoRA slot, the wait for both observed as one."""
        asked = time.monotonic()
        # A name no adapter has is refused before the engine: it needs no slot, and must
        # not have one drained for it.
        slots = self._slots if adapter != _UNRESOLVED_ADAPTER else None
        async with (
            self._gate.turn(adapter, sequences) if self._gate else contextlib.nullcontext(),
            slots.turn(adapter) if slots else contextlib.nullcontext(),
        ):
            if self._gate or slots:
                self._metrics.observe_gate_wait(time.monotonic() - asked)
            yield

    async def _prompt_ids(self, command: GenerateCommand) -> tuple[int, ...]:
        if command.render_prompt is not None:
            ids = tuple(await command.render_prompt())
        elif command.prompt_token_ids is not None:
            ids = command.prompt_token_ids
            vocab = self._engine.info.vocab_size
            for i, token in enumerate(ids):
                if not 0 <= token < vocab:
                    raise InvalidArgument(
                        f"prompt token_ids[{i}] = {token} is outside the vocabulary [0, {vocab})"
                    )
        elif command.prompt_text:
            ids = tuple(await self._engine.prompt_ids(command.prompt_text))
        else:
            ids = ()
        if not ids:
            raise InvalidArgument("prompt is empty: give prompt text or token_ids")
        return ids

    async def _pushed(
        self,
        request_id: str,
        prompt_ids: tuple[int, ...],
        spec: SamplingSpec,
        lease: Lease,
        admitted: float,
        outcome: Outcome,
        write: ChunkWriter,
        traced: RequestTrace,
    ) -> None:
        assert self._push is not None
        stream = PushedStream(
            write, request_id, len(prompt_ids), lease, admitted, outcome, self._metrics
        )
        try:
            outcome.submitted = time.monotonic()
            self._metrics.observe_queue_wait(outcome.submitted - admitted)
            await self._push(
                request_id,
                prompt_ids,
                spec,
                lease.adapter,
                stream,
                trace_headers=traced.engine_headers(),
            )
            await stream.done
        finally:
            if stream.finish is None:
                await asyncio.shield(self._engine.abort(request_id))
            outcome.generated = stream.generated
            self._metrics.tokens(lease.name, prompt=len(prompt_ids), generated=stream.generated)
        assert stream.finish is not None
        self._metrics.observe_inter_token_latency(outcome.first_token, stream.generated, 1)
        _log_finished(request_id, stream.finish, stream.generated, traced)

    async def _stream(
        self,
        request_id: str,
        prompt_ids: tuple[int, ...],
        spec: SamplingSpec,
        lease: Lease,
        outcome: Outcome,
        traced: RequestTrace,
    ) -> AsyncGenerator[GenerationChunk, None]:
        generated = 0
        first = True
        finish: FinishReason | None = None
        unfinished = set(range(spec.n))
        outcome.submitted = time.monotonic()
        self._metrics.observe_queue_wait(outcome.submitted - outcome.admitted)
        stream = self._engine.generate(
            request_id, prompt_ids, spec, lease.adapter, trace_headers=traced.engine_headers()
        )
        try:
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    token_ids = delta.token_ids
                    if not generated and token_ids:
                        self._first_token(outcome)
                    generated += len(token_ids)
                    outcome.charge(len(token_ids))
                    # Runs once per token: the plain middle of a stream takes the short path.
                    if delta.finish is None and not first and not delta.logprobs:
                        yield GenerationChunk(delta.text, token_ids, index=delta.index)
                        continue
                    if delta.finish is EngineFinish.ABORT:
                        raise Unavailable(f"the engine aborted request {request_id}; retry")
                    choice_finish = FINISH_REASONS.get(delta.finish) if delta.finish else None
                    if choice_finish is not None:
                        unfinished.discard(delta.index)
                        if not unfinished:
                            finish = choice_finish
                    yield GenerationChunk(
                        text=delta.text,
                        token_ids=token_ids,
                        adapter_name=lease.name if first else "",
                        revision=lease.revision if first else 0,
                        request_id=request_id if first else "",
                        finish_reason=choice_finish,
                        usage=Usage(len(prompt_ids), generated) if finish else None,
                        index=delta.index,
                        logprobs=delta.logprobs,
                        prompt_logprobs=delta.prompt_logprobs,
                        prompt_token_ids=prompt_ids if first else (),
                    )
                    first = False
        finally:
            outcome.generated = generated
            self._metrics.tokens(lease.name, prompt=len(prompt_ids), generated=generated)
        if finish is None:
            raise Unavailable(f"the engine ended request {request_id} without a finish reason")
        self._metrics.observe_inter_token_latency(outcome.first_token, generated, spec.n)
        _log_finished(request_id, finish, generated, traced)

    def _first_token(self, outcome: Outcome) -> None:
        outcome.first_token = time.monotonic()
        outcome.ttft_s = outcome.first_token - outcome.admitted
        self._metrics.observe_time_to_first_token(outcome.ttft_s)
