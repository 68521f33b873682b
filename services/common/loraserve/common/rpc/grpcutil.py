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
from loraserve.common.errors import InvalidArgument, LoraserveError, QuotaExceeded

log = logging.getLogger(__name__)

Behavior = Callable[..., Any]
Guard = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]


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


def _wrap_stream_response(behavior: Behavior, guard: Guard | None, method: str) -> Behavior:
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
                write = context.write
                async for response in responses:
                    await write(response)
        except (asyncio.CancelledError, AbortError):
            raise
        except Exception as exc:
            await _abort_for(exc, context, method)

    return wrapper


def wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any] | None, method: str, guard: Guard | None = None
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
            _wrap_stream_response(handler.unary_stream, guard, method), **kwargs
        )
    assert handler.stream_stream is not None
    return grpc.stream_stream_rpc_method_handler(
        _wrap_stream_response(handler.stream_stream, guard, method), **kwargs
    )


class ErrorMappingInterceptor(grpc.aio.ServerInterceptor):
    """Maps domain errors to gRPC statuses for every method of the server.

    `guard_for(method)` may return a check (authentication, say) that runs before
    the handler, inside the same error mapping and the same contextvars context.
    """

    def __init__(self, guard_for: Callable[[str], Guard | None] | None = None) -> None:
        self._guard_for = guard_for

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        guard = self._guard_for(method) if self._guard_for else None
        handler = await continuation(handler_call_details)
        return wrap_handler(handler, method, guard)
