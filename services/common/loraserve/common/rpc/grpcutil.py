"""Cross-cutting gRPC server behaviour: one place that turns errors into statuses.

`ErrorMappingInterceptor` wraps every handler, unary or streaming, so servicers
simply raise `LoraserveError` subclasses. Anything else escaping a handler is a bug:
it is logged with its traceback and becomes INTERNAL with a generic message.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc.aio import AbortError

from loraserve.common.config.textlimits import capped_message
from loraserve.common.errors import (
    InvalidArgument,
    LoraserveError,
    QuotaExceeded,
    ResourceExhausted,
)

log = logging.getLogger(__name__)

Behavior = Callable[..., Any]
Guard = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]
# Checks a call from its method and metadata alone, when its HEADERS arrive; raises.
HeadersCheck = Callable[[str, Any], None]


Trailers = tuple[tuple[str, str], ...]


def status_for(exc: Exception, method: str) -> tuple[grpc.StatusCode, str, Trailers]:
    """The status, message and trailing metadata that a handler's exception ends its call
    with, logged: a domain error as `rpc.error`, anything else as a bug (INTERNAL, its
    traceback logged, a generic message). One mapping for every transport."""
    if isinstance(exc, LoraserveError):
        # Capped: a status message longer than the client's metadata limit would replace
        # the status itself with RESOURCE_EXHAUSTED.
        message = capped_message(exc.message)
        log.info("rpc.error method=%s code=%s message=%s", method, exc.code.name, message)
        trailers: Trailers = ()
        if isinstance(exc, QuotaExceeded):
            trailers = (("retry-after", retry_after(exc.retry_after_s)),)
        return exc.code, message, trailers
    log.error("rpc.internal_error method=%s", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error in {method}", ()


async def _abort_for(
    exc: Exception, context: grpc.aio.ServicerContext[Any, Any], method: str
) -> None:
    code, message, trailers = status_for(exc, method)
    if trailers:
        context.set_trailing_metadata(trailers)
    await context.abort(code, message)


def retry_after(seconds: float) -> str:
    """Whole seconds, at least 1, as HTTP's Retry-After and the gRPC metadata say it."""
    return str(max(1, math.ceil(seconds)))


class _Undecodable:
    """A request message that did not parse, standing in for it so that the handler's
    wrapper can answer INVALID_ARGUMENT (a failing deserializer makes grpc answer
    INTERNAL, which says "our bug" to the client)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as exc:
            # E.g. a string field that is not UTF-8 (a lone surrogate's bytes).
            return _Undecodable(str(exc))

    return deserialize


def _check_decoded(request: Any) -> None:
    if isinstance(request, _Undecodable):
        raise InvalidArgument(f"the request message does not parse: {request.reason}")


def _wrap_unary_response(behavior: Behavior, guard: Guard | None, method: str) -> Behavior:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            _check_decoded(request)
            if guard is not None:
                await guard(context)
            return await behavior(request, context)
        except (asyncio.CancelledError, AbortError):
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return wrapper


def _wrap_stream_response(
    behavior: Behavior, guard: Guard | None, method: str, stalled_write_s: float | None
) -> Behavior:
    # A coroutine that writes, not a generator that re-yields: every streamed message
    # then passes one async generator fewer (the handler's own) on its way to the wire.
    async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            _check_decoded(request)
            if guard is not None:
                await guard(context)
            result = behavior(request, context)
            if inspect.isawaitable(result):
                # A handler that streams with context.write() rather than yielding, as
                # grpc's own health Watch does, is a plain coroutine.
                await result
                return
            # aclosing: a stream the client abandons closes the handler's generator now,
            # so its cleanup (aborting an engine request, say) runs at once.
            async with contextlib.aclosing(result) as responses:
                await _write_all(responses, context, stalled_write_s)
        except (asyncio.CancelledError, AbortError):
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return wrapper


async def _write_all(
    responses: Any, context: grpc.aio.ServicerContext[Any, Any], stalled_write_s: float | None
) -> None:
    """Writes every response; one that waits longer than `stalled_write_s` for the client
    to read (a write completes once flow control lets its bytes out) ends the call
    RESOURCE_EXHAUSTED: a peer that never reads holds nothing for longer than that. The
    clock runs only while a write waits, not while the handler makes the next message."""
    write = context.write
    if stalled_write_s is None:
        async for response in responses:
            await write(response)
        return
    clock = _WriteClock(stalled_write_s)
    try:
        async for response in responses:
            clock.waiting_since = clock.now()
            await write(response)
            clock.waiting_since = None
    except asyncio.CancelledError:
        # Only the clock's own cancel becomes RESOURCE_EXHAUSTED: one that came with it
        # (the client's, in the same pass of the loop) stays a cancel.
        if clock.fired and clock.task.uncancel() <= clock.cancelling_before:
            raise _stalled(stalled_write_s) from None
        raise
    finally:
        clock.stop()


class _WriteClock:
    """Cancels the current task once a write has waited `limit` seconds. One timer per
    stream, rearmed only when it comes due: a message costs two attribute writes and a
    clock read, where an `asyncio.timeout` rescheduled per message cost ~10 % of a
    streamed message's CPU."""

    def __init__(self, limit: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.now = self._loop.time
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a write clock needs a running task")
        self.task = task
        self.cancelling_before = task.cancelling()
        self._limit = limit
        # When the write in progress began; None between writes.
        self.waiting_since: float | None = None
        self.fired = False
        self._timer = self._loop.call_later(limit, self._check)

    def _check(self) -> None:
        since = self.waiting_since
        now = self.now()
        if since is not None and now - since >= self._limit:
            self.fired = True
            self.task.cancel()
            return
        self._timer = self._loop.call_at((since or now) + self._limit, self._check)

    def stop(self) -> None:
        self._timer.cancel()


def _stalled(stalled_write_s: float) -> ResourceExhausted:
    return ResourceExhausted(
        f"the client read none of the response for {stalled_write_s:g} s "
        "(--stalled-write-timeout); the call is ended and what it held released"
    )


def _refusing(exc: LoraserveError, method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that ends its call with `exc` before reading any request message: a
    streaming-request handler, so grpc does not read the body first as it does for a
    unary request (the wire format is the same)."""

    async def refuse(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await _abort_for(exc, context, method)

    return grpc.stream_stream_rpc_method_handler(refuse)


def wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any] | None,
    method: str,
    guard: Guard | None = None,
    stalled_write_s: float | None = None,
) -> grpc.RpcMethodHandler[Any, Any] | None:
    """Returns `handler` with error mapping, running `guard` first (e.g. auth)."""
    if handler is None:
        return None
    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary or handler.unary_stream:
        # One request message: one that does not parse is the caller's error.
        kwargs["request_deserializer"] = _tolerant(handler.request_deserializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            _wrap_unary_response(handler.unary_unary, guard, method), **kwargs
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            _wrap_unary_response(handler.stream_unary, guard, method), **kwargs
        )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            _wrap_stream_response(handler.unary_stream, guard, method, stalled_write_s), **kwargs
        )
    assert handler.stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(
        _wrap_stream_response(handler.stream_stream, guard, method, stalled_write_s), **kwargs
    )


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain errors to gRPC statuses for every method of the server.

    `check_headers(method, metadata)` runs when a call's HEADERS arrive and may refuse
    it (no valid token, say) before any of its request is read. `guard_for(method)` may
    return a check (authentication, say) that runs before the handler, inside the same
    error mapping and the same contextvars context. `stalled_write_s`: see `_write_all`.
    """

    def __init__(
        self,
        guard_for: Callable[[str], Guard | None] | None = None,
        *,
        check_headers: HeadersCheck | None = None,
        stalled_write_s: float | None = None,
    ) -> None:
        self._guard_for = guard_for
        self._check_headers = check_headers
        self._stalled_write_s = stalled_write_s

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        if self._check_headers is not None:
            try:
                self._check_headers(method, handler_call_details.invocation_metadata or ())
            except LoraserveError as exc:
                return _refusing(exc, method)
        guard = self._guard_for(method) if self._guard_for else None
        handler = await continuation(handler_call_details)
        return wrap_handler(handler, method, guard, self._stalled_write_s)
