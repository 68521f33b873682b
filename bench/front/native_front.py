"""Generate on the native transport (bench/front/grpc_floor_native.py), on the real
generation path: the grpc.aio servicer's translation (`_command`, `_response`), the same
runtime and generator, Rust's h2 for the wire. bench/front/grpclib_front.py serves it
beside `inference serve` with `--native-port`; bench/front/stream_probe.py's `native` arm
streams from it; with `upstream` its port serves the service's other RPCs, health and
reflection too, carried to the grpc.aio server. A probe, not a server to ship. A
call its client cancels or drops, or whose `grpc-timeout` runs out, has its task cancelled,
which aborts its engine request as over grpc.aio.

`serve_generate(..., pushed=True)` (`--pushed-port`, the `pushed` arm) asks what is left
once the per-token chain is gone. vLLM's output handler calls each request's collector
once per engine step; in the pull path that wakes the request's task, which resumes five
nested async generators (vLLM's, the engine wrapper's, the generator's two, the handler's)
for every token. Pushed, the collector is the call's stream itself: it makes and writes
the message inside the output handler's pass, and the call's task wakes once, at the end.
Admission, quotas, the fair turn, the lease and the request's metrics stay the runtime
Generator's own; only its `_stream` (the part that runs per token) is replaced, for a
plain request (n = 1, no logprobs); any other takes the pull path.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from google.protobuf.message import DecodeError

from bench.front.grpc_floor_native import Metadata, NativeFront, Write, streaming
from loraserve.common.errors import InvalidArgument, LoraserveError, Unavailable
from loraserve.common.rpc.security import ServerSecurity, TokenAuth, current_principal
from loraserve.inference.adapters import ROLLOUT_KEY_HEADER, Lease
from loraserve.inference.engine import SamplingSpec
from loraserve.inference.engine.vllm_engine import _failed, _lora_request
from loraserve.inference.serving.generation import GenerationChunk, Generator, _Outcome
from loraserve.inference.serving.runtime import RuntimeRef
from loraserve.inference.serving.servicer import _command, _response
from loraserve.inference.v1 import inference_pb2 as pb

log = logging.getLogger(__name__)

_FINISH = {"stop": pb.FINISH_REASON_STOP, "length": pb.FINISH_REASON_LENGTH}
# The writer of the call whose task runs the generator (a task copies its context).
_WRITE: contextvars.ContextVar[Write] = contextvars.ContextVar("native_write")


def _status(exc: Exception) -> tuple[int, str] | None:
    if isinstance(exc, LoraserveError):
        return int(exc.code.value[0]), exc.message
    return None


def serve_generate(
    runtime_ref: RuntimeRef,
    port: int = 0,
    pushed: bool = False,
    security: ServerSecurity | None = None,
    upstream: str | None = None,
    max_connection_age_s: float | None = None,
) -> NativeFront:
    """A listening native Generate on 127.0.0.1:`port` (0: ephemeral; see `.port`); with
    `pushed`, the engine's outputs become messages in vLLM's output handler. `security`
    is the grpc.aio server's: its tokens (a call needs one, as that server's guard asks
    for Generate) and its TLS files. With `upstream` (the grpc.aio server's "host:port"),
    every other call is carried there; `max_connection_age_s` is the server's too."""
    security = security or ServerSecurity()
    auth = TokenAuth(security, ()) if security.auth_enabled else None
    tls = None
    if security.tls_cert_file is not None and security.tls_key_file is not None:
        tls = (security.tls_cert_file, security.tls_key_file, security.tls_client_ca_file)

    async def messages(request: bytes, metadata: Metadata) -> AsyncIterator[bytes]:
        if auth is not None:
            principal, _ = auth.authenticate(metadata)
            current_principal.set(principal)
        rollout_key = next((v for k, v in metadata if k == ROLLOUT_KEY_HEADER), "")
        try:
            parsed = pb.GenerateRequest.FromString(request)
        except DecodeError as exc:
            raise InvalidArgument(f"the request is not a GenerateRequest: {exc}") from exc
        command = _command(parsed, rollout_key)
        generator = runtime_ref.get().generator
        if pushed:
            generator = _pushed(generator)
        chunks = generator.generate(command)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                yield _response(chunk).SerializeToString()

    handler = streaming(messages)
    if not pushed:
        return NativeFront(
            handler,
            _status,
            port,
            upstream=upstream,
            tls=tls,
            max_connection_age_s=max_connection_age_s,
        )

    async def pushing(request: bytes, metadata: Metadata, write: Write) -> None:
        _WRITE.set(write)
        await handler(request, metadata, write)

    return NativeFront(
        pushing,
        _status,
        port,
        upstream=upstream,
        tls=tls,
        max_connection_age_s=max_connection_age_s,
    )


def _pushed(generator: Generator) -> Generator:
    """The runtime's generator, sharing its engine, registry, gates and metrics, with the
    pushed `_stream`."""
    pushed = copy.copy(generator)
    pushed.__class__ = PushedGenerator
    return pushed


class PushedGenerator(Generator):
    async def _stream(
        self,
        request_id: str,
        prompt_ids: tuple[int, ...],
        spec: SamplingSpec,
        lease: Lease,
        admitted: float,
        outcome: _Outcome,
    ) -> AsyncGenerator[GenerationChunk, None]:
        params = spec.params
        if spec.n > 1 or params.logprobs is not None or params.prompt_logprobs is not None:
            async for chunk in super()._stream(
                request_id, prompt_ids, spec, lease, admitted, outcome
            ):
                yield chunk
            return
        from vllm.exceptions import VLLMClientError
        from vllm.v1.engine.exceptions import EngineDeadError

        llm = self._engine._llm  # type: ignore[attr-defined]
        stream = _PushedStream(self, request_id, len(prompt_ids), params, lease, admitted, outcome)
        try:
            collector = await llm.add_request(
                request_id,
                {"prompt_token_ids": list(prompt_ids)},
                params,
                lora_request=_lora_request(lease.adapter) if lease.adapter else None,
            )
        except EngineDeadError as exc:
            raise Unavailable("the inference engine has stopped") from exc
        except (VLLMClientError, ValueError) as exc:
            raise InvalidArgument(f"the engine rejected the request: {exc}") from exc
        except BaseException:
            # Cancelled while adding: the engine may hold the request already.
            await asyncio.shield(llm.abort(request_id))
            raise
        # From here on vLLM hands the request's outputs to the stream. Whatever came while
        # add_request awaited waits in vLLM's own collector (all of it, if the request has
        # already ended and left the output processor).
        state = llm.output_processor.request_states.get(collector.request_id)
        if state is not None:
            state.queue = stream
        try:
            early = collector.get_nowait()
        except Exception as exc:
            early = exc
        if early is not None:
            stream.put(early)
        if state is None and not stream.done.done():
            stream.put(Unavailable(f"the engine lost request {request_id}; retry"))
        try:
            await stream.done
        finally:
            if not stream.finished:
                await asyncio.shield(llm.abort(collector.request_id, internal=True))
            outcome.generated = stream.generated
            self._metrics.tokens(lease.name, prompt=len(prompt_ids), generated=stream.generated)
        log.info(
            "generate.finished request_id=%s reason=%s completion_tokens=%d",
            request_id,
            stream.reason,
            stream.generated,
        )
        return
        yield


class _PushedStream:
    """Stands in for vLLM's per-request collector: each step's output becomes the call's
    message right there, in the output handler's pass."""

    def __init__(
        self,
        generator: PushedGenerator,
        request_id: str,
        prompt_tokens: int,
        params: Any,
        lease: Lease,
        admitted: float,
        outcome: _Outcome,
    ) -> None:
        self._generator, self._request_id, self._params = generator, request_id, params
        self._prompt_tokens, self._lease = prompt_tokens, lease
        self._admitted, self._outcome = admitted, outcome
        self._write = _WRITE.get()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.generated = 0
        self._first = True
        self.finished = False
        self.reason = ""

    def put(self, output: Any) -> None:
        if self.done.done():
            return
        try:
            self._put(output)
        except Exception as exc:
            # vLLM's output handler serves every request: a failure here ends this call
            # alone (INTERNAL, logged by the front), never the handler.
            self.done.set_exception(exc)

    def _put(self, output: Any) -> None:
        if isinstance(output, Exception):
            from vllm.v1.engine.exceptions import EngineDeadError

            dead = isinstance(output, EngineDeadError)
            self.done.set_exception(
                Unavailable("the inference engine has stopped") if dead else output
            )
            return
        completion = output.outputs[0]
        reason = completion.finish_reason
        if reason == "error":
            self.done.set_exception(_failed(self._request_id, self._params))
            return
        token_ids = completion.token_ids
        if not self.generated and token_ids:
            self._outcome.ttft_s = time.monotonic() - self._admitted
            self._generator._metrics.observe_time_to_first_token(self._outcome.ttft_s)
        self.generated += len(token_ids)
        self._outcome.charge(len(token_ids))
        if reason == "abort":
            self.done.set_exception(
                Unavailable(f"the engine aborted request {self._request_id}; retry")
            )
            return
        response = pb.GenerateResponse(text=completion.text, token_ids=token_ids)
        if self._first:
            self._first = False
            response.adapter_name = self._lease.name
            response.revision = self._lease.revision
            response.request_id = self._request_id
        if reason in _FINISH:
            response.finish_reason = _FINISH[reason]
            response.usage.prompt_tokens = self._prompt_tokens
            response.usage.completion_tokens = self.generated
            self.finished, self.reason = True, reason
        self._write(response.SerializeToString())
        if self.finished:
            self.done.set_result(None)
        elif output.finished:
            # A finish loraserve does not know (vLLM's "repetition", say), as the pull path.
            self.done.set_exception(
                Unavailable(f"the engine ended request {self._request_id} without a finish reason")
            )
