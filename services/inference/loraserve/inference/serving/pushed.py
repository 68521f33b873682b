"""A Generate stream pushed by the engine's output handler rather than pulled by the
call's task (see `loraserve.inference.engine.pushed`).

`PushedStream` is the request's sink in the engine: each engine step it does, right in
the output handler's pass, what the pull path's per-delta loop does (the first token's
time, the quota's charge, the finish) and hands the chunk to the front's writer, which
makes and writes the message. The call's task waits once, for the end. Admission, quotas,
the fair turn, the lease and the request's metrics stay the generator's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from loraserve.common.errors import Unavailable
from loraserve.inference.adapters import Lease
from loraserve.inference.engine import AdapterHandle, EngineFinish, SamplingSpec
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving.chunks import (
    FINISH_REASONS,
    FinishReason,
    GenerationChunk,
    Outcome,
    Usage,
)

# The front's writer of a pushed stream's chunks: called in the engine's output handler,
# it makes the message and queues it for the wire (it must not block).
ChunkWriter = Callable[[GenerationChunk], None]


class Push(Protocol):
    """The engine's `push`: adds a request whose outputs go to a sink (`trace_headers`:
    the request's span, as `Engine.generate` takes it)."""

    def __call__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        sink: PushedStream,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> Awaitable[None]: ...


def pushable(spec: SamplingSpec) -> bool:
    """Whether a request can be pushed: one choice, no logprobs (any other takes the pull
    path, whose per-token work those need)."""
    params = spec.params
    return spec.n == 1 and params.logprobs is None and params.prompt_logprobs is None


class PushedStream:
    """A pushed request's sink in the engine (`DeltaSink`): `done` resolves once the
    stream has ended, or fails with what ended it."""

    def __init__(
        self,
        write: ChunkWriter,
        request_id: str,
        prompt_tokens: int,
        lease: Lease,
        admitted: float,
        outcome: Outcome,
        metrics: InferenceMetrics,
    ) -> None:
        self._write, self._request_id = write, request_id
        self._prompt_tokens, self._lease = prompt_tokens, lease
        self._admitted, self._outcome, self._metrics = admitted, outcome, metrics
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.generated = 0
        self._first = True
        self.finish: FinishReason | None = None

    def fail(self, error: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(error)

    def delta(
        self, text: str, token_ids: Sequence[int], finish: EngineFinish | None, finished: bool
    ) -> None:
        if self.done.done():
            return
        try:
            self._delta(text, token_ids, finish, finished)
        except Exception as exc:
            # vLLM's output handler serves every request: a failure here ends this call
            # alone (INTERNAL, logged by the front), never the handler.
            self.done.set_exception(exc)

    def _delta(
        self, text: str, token_ids: Sequence[int], finish: EngineFinish | None, finished: bool
    ) -> None:
        # What the pull loop (`Generator._stream`) does per delta, once per engine step.
        outcome = self._outcome
        if not self.generated and token_ids:
            outcome.first_token = time.monotonic()
            outcome.ttft_s = outcome.first_token - self._admitted
            self._metrics.observe_time_to_first_token(outcome.ttft_s)
        self.generated += len(token_ids)
        outcome.charge(len(token_ids))
        if finish is EngineFinish.ABORT:
            self.done.set_exception(
                Unavailable(f"the engine aborted request {self._request_id}; retry")
            )
            return
        reason = FINISH_REASONS.get(finish) if finish is not None else None
        chunk = GenerationChunk(text, token_ids, finish_reason=reason)
        if self._first:
            self._first = False
            chunk.adapter_name, chunk.revision = self._lease.name, self._lease.revision
            chunk.request_id = self._request_id
        if reason is not None:
            self.finish = reason
            chunk.usage = Usage(self._prompt_tokens, self.generated)
        self._write(chunk)
        if reason is not None:
            self.done.set_result(None)
        elif finished:
            # A finish loraserve does not know (vLLM's "repetition", say), as the pull path.
            self.done.set_exception(
                Unavailable(f"the engine ended request {self._request_id} without a finish reason")
            )
