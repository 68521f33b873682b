"""bench/front/grpc_floor.py's `native` server: the messages made on the event loop as in
every other variant, the transport in Rust (bench/front/native: h2 on a Tokio thread).

Each loop pass's messages cross into Rust in one call; h2 then writes every stream's
frames of a connection in one socket write. It builds the crate when loaded, offline,
from Debian's packaged crates (bench/front/native/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.machinery
import importlib.util
import logging
import math
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from types import ModuleType

import grpc

from bench.front.grpc_floor_servers import GENERATE, AioServicer, LoopTicker, Shape
from loraserve.common.config.sizes import MESSAGE_LIMIT

log = logging.getLogger(__name__)

CRATE = Path(__file__).with_name("native")
LIBRARY = CRATE / "target" / "release" / "libgrpc_floor_native.so"
# Where Debian's librust-*-dev packages put their crates' sources.
DEBIAN_CRATES = "/usr/share/cargo/registry"
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


UNBUILDABLE = "the native probe needs cargo and Debian's crates (bench/front/native/README.md)"


# The crates Cargo.toml names, as Debian's registry holds them (`make native-probe`).
CRATES = (
    "bytes-1.",
    "futures-util-0.3.",
    "h2-0.3.",
    "http-0.2.",
    "pyo3-0.17.",
    "rustls-pemfile-1.",
    "tokio-1.",
    "tokio-rustls-0.23.",
)


def buildable() -> bool:
    """Whether `build` can work here: cargo, and Debian's crates."""
    registry = Path(DEBIAN_CRATES)
    return shutil.which("cargo") is not None and all(
        any(registry.glob(f"{crate}*")) for crate in CRATES
    )


def build() -> Path:
    """Builds the crate for this interpreter (cargo, offline, Debian's crates)."""
    subprocess.run(
        [
            "cargo",
            "build",
            "--release",
            "--offline",
            "--config",
            'source.crates-io.replace-with="debian"',
            "--config",
            f'source.debian.directory="{DEBIAN_CRATES}"',
        ],
        cwd=CRATE,
        env={**os.environ, "PYO3_PYTHON": sys.executable},
        check=True,
    )
    return LIBRARY


@functools.cache
def load() -> ModuleType:
    """The module, built first (cargo rebuilds only what changed); once per process, as
    PyO3 allows."""
    path = build()
    loader = importlib.machinery.ExtensionFileLoader("grpc_floor_native", str(path))
    spec = importlib.util.spec_from_file_location("grpc_floor_native", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# Writes one serialized message of a call; it leaves with the loop pass's others.
Write = Callable[[bytes], None]
# A call's metadata: its ASCII custom headers, (key, value) each, as grpc.aio gives them;
# binary ("-bin") entries are left out.
Metadata = Sequence[tuple[str, str]]
# A call's handler: its request message, metadata and writer; the call ends OK when it
# returns. It may write from any callback on the loop, not only from its own task.
Handler = Callable[[bytes, Metadata, Write], Awaitable[None]]
# What ends a failed call: its exception's gRPC status code and message, or None for a bug
# (the call ends INTERNAL and the exception is logged).
Status = Callable[[Exception], tuple[int, str] | None]


def streaming(messages: Callable[[bytes, Metadata], AsyncIterator[bytes]]) -> Handler:
    """A handler that writes what an async iterator of serialized messages yields."""

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        async for message in messages(request, metadata):
            write(message)

    return handler


class NativeFront:
    """Feeds the Rust server: one task per call running its handler, and one `send` of
    everything the loop pass wrote. A call the server hands back as ended early (reset by
    its client, its connection gone, past its deadline) has its task cancelled, as
    grpc.aio cancels a handler's.

    It listens on `host`:`port` (port 0: an ephemeral one, see `.port`). The handler
    serves calls to `path` (Generate); the server carries every other call to the gRPC
    server at `upstream` ("host:port", or "unix:PATH" for a Unix socket, which keeps that
    server off the network), or refuses it UNIMPLEMENTED without one.
    With `tls` (certificate chain, key and client CA PEM files, the CA optional) it serves
    TLS, mTLS with a client CA; a file it cannot use raises ValueError naming it. With
    `max_connection_age_s`, each connection is asked to close (GOAWAY, the age jittered by
    10 % as grpc core does) once that old: its calls finish on it, new ones come on another.
    A request over the services' MESSAGE_LIMIT is refused RESOURCE_EXHAUSTED, as theirs is.
    With `keepalive_s` (interval, timeout; None: none), each peer is pinged every interval
    and its connection dropped once a ping goes unanswered for the timeout, its calls
    cancelled: a peer that vanished without closing holds nothing for long.
    """

    def __init__(
        self,
        handler: Handler,
        status: Status = lambda _: None,
        port: int = 0,
        *,
        host: str = "127.0.0.1",
        path: str = GENERATE,
        upstream: str | None = None,
        tls: tuple[Path, Path, Path | None] | None = None,
        max_connection_age_s: float | None = None,
        keepalive_s: tuple[float, float] | None = (KEEPALIVE_TIME_S, KEEPALIVE_TIMEOUT_S),
    ) -> None:
        self._handler, self._status = handler, status
        files = None if tls is None else tuple(None if f is None else str(f) for f in tls)
        native = load()
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
        until = self._loop.time() + min(grace or 0.0, _MAX_WAIT_S)
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
        self.close()

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

    def _forget(self, call: int, task: asyncio.Task[None]) -> None:
        del self._tasks[call]
        # Cancelled here (before it ran, or while it ran, or by its own handler), not by
        # its client or deadline: the call still needs its status.
        if task.cancelled() and call not in self._ended and self._doorbell >= 0:
            self._flush()
            self._server.finish(call, *self._cancelled)
        self._ended.discard(call)

    async def _respond(self, call: int, request: bytes, metadata: Metadata) -> None:
        try:
            await self._handler(request, metadata, functools.partial(self._write, call))
        except Exception as exc:
            status = None
            with contextlib.suppress(Exception):
                status = self._status(exc)
            if status is None:
                log.exception("native.call_failed call=%d", call)
            self._flush()
            self._server.finish(call, *(status or (_INTERNAL, "internal error")))
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


async def serve(shape: Shape, ticker: LoopTicker, ready: Callable[[int], None]) -> None:
    """Serves until killed; `ready(port)` once listening."""
    servicer = AioServicer(shape, ticker if shape.paced else None, write=False)

    async def messages(request: bytes, metadata: Metadata) -> AsyncIterator[bytes]:
        async for message in servicer._yielded(None, None):
            yield message.SerializeToString()

    front = NativeFront(streaming(messages))
    if shape.paced:
        ticker.start()
    ready(front.port)
    await asyncio.Event().wait()
