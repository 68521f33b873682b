"""The native transport's Python half: one task per call running its handler on the
event loop, and one `send` into Rust of everything a loop pass wrote.

The Rust half (`services/inference/native`, `loraserve_native`) serves server-streaming
gRPC over h2 on a Tokio thread of its own: it frames and writes what Python serialized,
every stream's frames of a connection in one socket write, and carries every call but
the one it serves to an upstream gRPC server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import math
import os
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import ModuleType

import grpc

from loraserve.common.config.sizes import MESSAGE_LIMIT

log = logging.getLogger(__name__)

_CANCELLED = grpc.StatusCode.CANCELLED.value[0]
_INTERNAL = grpc.StatusCode.INTERNAL.value[0]
_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
# grpc core's server defaults: a ping after two hours, twenty seconds to answer it.
KEEPALIVE_TIME_S = 7200.0
KEEPALIVE_TIMEOUT_S = 20.0
# How long the statuses of calls cancelled at the end of a stop's grace have to leave.
_LAST_WORDS_S = 1.0
# The longest wait handed to the server, in seconds (its clocks hold no more).
_MAX_WAIT_S = 1e9

# Writes one serialized message of a call; it leaves with the loop pass's others.
Write = Callable[[bytes], None]
# A call's metadata: its ASCII custom headers, (key, value) each, as grpc.aio gives them;
# binary ("-bin") entries are left out.
Metadata = Sequence[tuple[str, str]]
# A call's handler: its request message, metadata and writer; the call ends OK when it
# returns. It may write from any callback on the loop, not only from its own task.
Handler = Callable[[bytes, Metadata, Write], Awaitable[None]]
# How a failed call ends: its gRPC status code, message and trailing metadata.
Ending = tuple[int, str, Sequence[tuple[str, str]]]
# What ends a failed call, or None for a bug (the call ends INTERNAL, the exception logged).
Status = Callable[[Exception], Ending | None]


def load_native() -> ModuleType:
    """The Rust half; ImportError, saying why, where it is not built (`make setup` builds
    it where cargo and the crates are: services/inference/native/README.md)."""
    try:
        return importlib.import_module("loraserve.inference.transport.loraserve_native")
    except ImportError as exc:
        raise ImportError(
            f"the native transport is not built ({exc}); `make native` builds it "
            "(services/inference/native/README.md)"
        ) from exc


class NativeFront:
    """Feeds the Rust server: one task per call running its handler, and one `send` of
    everything the loop pass wrote. A call the server hands back as ended early (reset by
    its client, its connection gone, past its deadline) has its task cancelled, as
    grpc.aio cancels a handler's.

    It listens on `host`:`port` (port 0: an ephemeral one, see `.port`). The handler
    serves calls to `path`; the server carries every other call to the gRPC server at
    `upstream` ("host:port", or "unix:PATH" for a Unix socket, which keeps that server
    off the network), or refuses it UNIMPLEMENTED without one.
    With `tls` (certificate chain, key and client CA PEM files, the CA optional) it serves
    TLS, mTLS with a client CA; a file it cannot use raises ValueError naming it. With
    `max_connection_age_s`, each connection is asked to close (GOAWAY, the age jittered by
    10 % as grpc core does) once that old: its calls finish on it, new ones come on another.
    A request over the services' MESSAGE_LIMIT is refused RESOURCE_EXHAUSTED, as theirs is.
    With `keepalive_s` (interval, timeout; None: none), each peer is pinged every interval
    and its connection dropped once a ping goes unanswered for the timeout, its calls
    cancelled: a peer that vanished without closing holds nothing for long.
    A panic in one connection ends that connection; where the server can no longer serve
    any call (a task every call needs panicked), `on_failure` is called once with why,
    and the owner stops the server.
    """

    def __init__(
        self,
        handler: Handler,
        status: Status = lambda _: None,
        port: int = 0,
        *,
        path: str,
        host: str = "127.0.0.1",
        upstream: str | None = None,
        tls: tuple[Path, Path, Path | None] | None = None,
        max_connection_age_s: float | None = None,
        keepalive_s: tuple[float, float] | None = (KEEPALIVE_TIME_S, KEEPALIVE_TIMEOUT_S),
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self._handler, self._status = handler, status
        self._on_failure = on_failure
        self.failure: str | None = None
        files = None if tls is None else tuple(None if f is None else str(f) for f in tls)
        native = load_native()
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in [0, 65535], not {port}")
        self._doorbell, writer = os.pipe()
        try:
            # The service's --max-connection-age 0 means "never".
            age = max_connection_age_s or None
            # The server owns `writer` from here, and closes it on failure too.
            self._server = native.Server(
                writer, host, port, path, upstream, files, age, keepalive_s, MESSAGE_LIMIT
            )
        except BaseException:
            os.close(self._doorbell)
            raise
        os.set_blocking(self._doorbell, False)
        self._loop = asyncio.get_running_loop()
        # (call, serialized message), or (call, None) to end the call with status OK.
        self._pending: list[tuple[int, bytes | None]] = []
        self._tasks: dict[int, asyncio.Task[None]] = {}
        # Calls the server ended early, whose tasks are cancelled: they have their status.
        self._ended: set[int] = set()
        # What a call cancelled here (not by its client or deadline) ends with.
        self._cancelled = (_CANCELLED, "the call was cancelled on the server")
        self._loop.add_reader(self._doorbell, self._take)

    @property
    def port(self) -> int:
        return int(self._server.port)

    async def stop(self, grace: float | None) -> None:
        """Stops as grpc.aio's `server.stop(grace)` does: no new connection or call, the
        calls in flight go on for up to `grace` seconds (None: not at all), then whatever
        is left is cancelled, ending UNAVAILABLE, and every connection dropped."""
        if grace is not None and math.isnan(grace):
            raise ValueError("grace must be a number of seconds or None, not NaN")
        self._server.shutdown()
        try:
            await self._drain(min(grace or 0.0, _MAX_WAIT_S))
        finally:
            # Also when the stop itself is cancelled: nothing keeps listening or running.
            self.close()

    async def _drain(self, grace_s: float) -> None:
        until = self._loop.time() + grace_s
        # Calls that came before the server's GOAWAY reached their client arrive late.
        while self._tasks and (left_s := until - self._loop.time()) > 0:
            await asyncio.wait(list(self._tasks.values()), timeout=left_s)
        self._cancelled = (_UNAVAILABLE, "the server stopped before the call finished")
        left = list(self._tasks.values())
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        self._flush()
        # What the calls wrote last, or the status of those cancelled, is still to leave:
        # their connections close once it has (given a moment past the grace for the latter).
        wait_s = max(until - self._loop.time(), _LAST_WORDS_S if left else 0.0)
        await asyncio.to_thread(self._server.wait_closed, wait_s)

    def close(self) -> None:
        """Drops every connection and cancels every call; once, however often called."""
        if self._doorbell < 0:
            return
        self._server.close()
        self._loop.remove_reader(self._doorbell)
        os.close(self._doorbell)
        self._doorbell = -1
        for task in list(self._tasks.values()):
            task.cancel()

    def _take(self) -> None:
        # Read before taking: what is announced after the take rings again.
        os.read(self._doorbell, 4096)
        arrived, ended = self._server.take()
        for call, request, metadata in arrived:
            task = self._loop.create_task(self._respond(call, request, metadata))
            self._tasks[call] = task
            task.add_done_callback(functools.partial(self._forget, call))
        for call in ended:
            if call in self._tasks:
                self._ended.add(call)
                self._tasks[call].cancel()
        if self.failure is None and (failure := self._server.failure()) is not None:
            self.failure = failure
            log.error("native.transport_failed reason=%s", failure)
            if self._on_failure is not None:
                self._on_failure(failure)

    def _forget(self, call: int, task: asyncio.Task[None]) -> None:
        del self._tasks[call]
        # Cancelled here (before it ran, or while it ran, or by its own handler), not by
        # its client or deadline: the call still needs its status.
        if task.cancelled() and call not in self._ended and self._doorbell >= 0:
            self._flush()
            self._server.finish(call, *self._cancelled, [])
        self._ended.discard(call)

    async def _respond(self, call: int, request: bytes, metadata: Metadata) -> None:
        try:
            await self._handler(request, metadata, functools.partial(self._write, call))
        except Exception as exc:
            ending = None
            with contextlib.suppress(Exception):
                ending = self._status(exc)
            if ending is None:
                log.exception("native.call_failed call=%d", call)
            code, message, trailing = ending or (_INTERNAL, "internal error", ())
            self._flush()
            self._server.finish(call, code, message, list(trailing))
            return
        self._write(call, None)

    def _write(self, call: int, payload: bytes | None) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append((call, payload))

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            self._server.send(pending)
