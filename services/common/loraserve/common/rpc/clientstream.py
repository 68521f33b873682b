"""Client-streaming calls that report the status the server ended them with.

A server may answer a client-streaming call before the client has sent everything:
the store refuses a push without a token, over a size limit or with a bad file as
soon as it knows, rather than after gigabytes. HTTP/2 allows this and the client must
keep the server's status (RFC 9113 §8.1), but grpc.aio (grpc/grpc#36066) turns the
next write's failure into `INTERNAL: Internal error from Core` and, when that failure
is handled after the server's status arrived, overwrites the status with it: the
caller then sees a server bug instead of the refusal, about half the time.

`ClientStream` records the status the moment the call ends, stops writing once the
call has ended, and raises the server's status in place of grpc's stand-in. Every
client-streaming call in loraserve goes through it (or through `stream_unary`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, Coroutine, Iterable
from typing import Any, Generic, TypeVar

import grpc

Request = TypeVar("Request")
Response = TypeVar("Response")
T = TypeVar("T")

# What grpc.aio's `set_internal_error` puts in place of the status after a failed write.
_STAND_IN_DETAILS = "Internal error from Core"


def _now(coroutine: Coroutine[Any, Any, T]) -> T | None:
    """The coroutine's result if it finishes without waiting; None if it would wait.

    A finished call's status accessors return at once; stepping them in the done
    callback reads the status before a later failed write can replace it.
    """
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    return None


def _is_stand_in(code: grpc.StatusCode, details: str | None) -> bool:
    return code is grpc.StatusCode.INTERNAL and details == _STAND_IN_DETAILS


class ClientStream(Generic[Request, Response]):
    """Writes the requests of one stream-unary call in the reader/writer style."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._delivered: grpc.aio.AioRpcError | None = None
        call.add_done_callback(self._record_status)

    def _record_status(self, call: Any) -> None:
        code = _now(call.code())
        details = _now(call.details())
        if code is None or code is grpc.StatusCode.OK or _is_stand_in(code, details):
            return
        self._delivered = grpc.aio.AioRpcError(
            code,
            grpc.aio.Metadata(),
            _now(call.trailing_metadata()) or grpc.aio.Metadata(),
            details,
            _now(call.debug_error_string()),
        )

    async def write(self, request: Request) -> bool:
        """Sends one request; False once the call has ended (its result says how)."""
        if self._call.done():
            return False
        try:
            await self._call.write(request)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            return False
        return True

    async def result(self) -> Response:
        """Half-closes the stream and returns the response, or raises the call's status."""
        # A call that has already ended fails here; awaiting it below tells how.
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._call.done_writing()
        try:
            response: Response = await self._call
        except grpc.aio.AioRpcError as exc:
            if self._delivered is not None and _is_stand_in(exc.code(), exc.details()):
                raise self._delivered from None
            raise
        return response

    def cancel(self) -> None:
        self._call.cancel()


async def stream_unary(
    method: Any,
    requests: Iterable[Request] | AsyncIterable[Request],
    **call_options: Any,
) -> Any:
    """Calls the stream-unary stub `method` with `requests`; the response, or the
    server's status raised as `AioRpcError` even when it ended the call early."""
    stream: ClientStream[Request, Any] = ClientStream(method(**call_options))
    try:
        if isinstance(requests, AsyncIterable):
            async for request in requests:
                if not await stream.write(request):
                    break
        else:
            for request in requests:
                if not await stream.write(request):
                    break
        return await stream.result()
    except BaseException:
        stream.cancel()
        raise
