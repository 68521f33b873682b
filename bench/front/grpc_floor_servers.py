"""The server side of bench/front/grpc_floor.py: one process per run, serving InferenceService's
Generate with no engine, built one of several ways (a VARIANT).

Every variant streams the same messages: `--messages` GenerateResponses per call, one
token each, the first naming request, adapter and revision, the last a finish reason and
usage (as the real servicer's). Tokens come either as fast as the transport takes them
(`closed`) or from a ticker that gives every open stream one token each `--step-ms`
(`paced`: an engine step, the same load for every variant).

Kinds: `aio` (grpc.aio server, tokens from its own event loop, on uvloop unless named
`-asyncio`; `-write`: context.write() instead of yield; `-throughput`:
grpc.optimization_target; `-poll`: GRPC_POLL_STRATEGY=poll; `-ee-on`/`-ee-off`: grpc
core's EventEngine experiments), `sync` (grpc.server on
a thread pool, tokens made in each handler thread; paced by a ticker thread), `bridge`
(grpc.server on a thread pool fed from an asyncio loop in another thread, as an
AsyncLLM would be: paced, the loop's ticker hands each token to the handler thread through
a queue.SimpleQueue; closed, the handler thread pulls each token from an async generator
on the loop with asyncio.run_coroutine_threadsafe), `bridge-rcts` (paced only: the
handler thread awaits an asyncio.Queue on the loop through run_coroutine_threadsafe per
token), the pure-Python HTTP/2 servers of bench/front/grpc_floor_h2.py (`grpclib`,
`grpclib-coalesce`, `h2-lean`) and `native` (bench/front/grpc_floor_native.py: the
messages made on the loop as here, the transport Rust's h2 on a thread of its own).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import queue
import sys
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

GENERATE = "/loraserve.inference.v1.InferenceService/Generate"


@dataclass(frozen=True)
class Variant:
    """How one server is built: its kind, event loop, channel options and environment."""

    kind: str
    uvloop: bool = True
    options: tuple[tuple[str, Any], ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    # aio only: the handler writes with context.write() instead of yielding.
    write: bool = False


# grpc core's EventEngine experiments (listener, endpoints, client), all on or all off.
_EVENT_ENGINE = (
    "event_engine_listener",
    "event_engine_for_all_other_endpoints",
    "event_engine_client",
)
VARIANTS = {
    "aio": Variant("aio"),
    "aio-asyncio": Variant("aio", uvloop=False),
    "aio-write": Variant("aio", write=True),
    "aio-throughput": Variant("aio", options=(("grpc.optimization_target", "throughput"),)),
    "aio-poll": Variant("aio", env=(("GRPC_POLL_STRATEGY", "poll"),)),
    "aio-ee-on": Variant("aio", env=(("GRPC_EXPERIMENTS", ",".join(_EVENT_ENGINE)),)),
    "aio-ee-off": Variant(
        "aio", env=(("GRPC_EXPERIMENTS", ",".join("-" + e for e in _EVENT_ENGINE)),)
    ),
    "sync": Variant("sync"),
    "sync-throughput": Variant("sync", options=(("grpc.optimization_target", "throughput"),)),
    "bridge": Variant("bridge"),
    "bridge-rcts": Variant("bridge-rcts"),
    "grpclib": Variant("grpclib"),
    "grpclib-coalesce": Variant("grpclib-coalesce"),
    "h2-lean": Variant("h2-lean"),
    "native": Variant("native"),
}


@dataclass
class Shape:
    """What every variant streams."""

    messages: int
    paced: bool
    step_s: float
    _ids: Iterator[int] = field(default_factory=itertools.count)

    def message(self, i: int) -> pb.GenerateResponse:
        """The i-th message of a call (0-based), shaped as the servicer's."""
        response = pb.GenerateResponse(text="x", token_ids=(100 + i % 300,))
        if i == 0:
            response.adapter_name = "tenant-0"
            response.revision = 1
            response.request_id = f"req-{next(self._ids)}"
        if i == self.messages - 1:
            response.finish_reason = pb.FINISH_REASON_LENGTH
            response.usage.prompt_tokens = 16
            response.usage.completion_tokens = self.messages
        return response


class LoopTicker:
    """An engine step on an event loop: every step, one token to each open stream."""

    def __init__(self, step_s: float) -> None:
        self._step_s = step_s
        self._sinks: set[Callable[[int], None]] = set()
        self._task: asyncio.Task[None] | None = None

    def open(self, sink: Callable[[int], None]) -> Callable[[], None]:
        self._sinks.add(sink)
        return lambda: self._sinks.discard(sink)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tick = loop.time()
        for token in itertools.count():
            tick += self._step_s
            await asyncio.sleep(max(0.0, tick - loop.time()))
            for sink in list(self._sinks):
                sink(token)


class ThreadTicker:
    """The same step on a thread, for the sync server's handler threads."""

    def __init__(self, step_s: float) -> None:
        self._step_s = step_s
        self._sinks: set[Callable[[int], None]] = set()
        self._lock = threading.Lock()

    def open(self, sink: Callable[[int], None]) -> Callable[[], None]:
        with self._lock:
            self._sinks.add(sink)

        def close() -> None:
            with self._lock:
                self._sinks.discard(sink)

        return close

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        tick = time.monotonic()
        for token in itertools.count():
            tick += self._step_s
            time.sleep(max(0.0, tick - time.monotonic()))
            with self._lock:
                sinks = list(self._sinks)
            for sink in sinks:
                sink(token)


class AioServicer(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, shape: Shape, ticker: LoopTicker | None, write: bool) -> None:
        self._shape, self._ticker, self._write = shape, ticker, write

        # grpc.aio tells a streaming handler's style from the function itself.
        self.Generate = self._written if write else self._yielded

    async def _yielded(self, request: Any, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        shape = self._shape
        if self._ticker is None:
            for i in range(shape.messages):
                yield shape.message(i)
            return
        tokens: asyncio.Queue[int] = asyncio.Queue()
        close = self._ticker.open(tokens.put_nowait)
        try:
            for i in range(shape.messages):
                await tokens.get()
                yield shape.message(i)
        finally:
            close()

    async def _written(self, request: Any, context: Any) -> None:
        async for message in self._yielded(request, context):
            await context.write(message)


class SyncServicer(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Tokens made in the handler thread, or handed to it by a ticker through a queue."""

    def __init__(self, shape: Shape, ticker: ThreadTicker | LoopTicker | None) -> None:
        self._shape, self._ticker = shape, ticker

    def Generate(self, request: pb.GenerateRequest, context: Any) -> Iterator[pb.GenerateResponse]:
        shape = self._shape
        if self._ticker is None:
            for i in range(shape.messages):
                yield shape.message(i)
            return
        tokens: queue.SimpleQueue[int] = queue.SimpleQueue()
        # From a LoopTicker, put() runs on the loop's thread: SimpleQueue is thread-safe.
        close = self._ticker.open(tokens.put)
        try:
            for i in range(shape.messages):
                tokens.get()
                yield shape.message(i)
        finally:
            close()


class BridgePullServicer(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Each token pulled from an async generator on the loop, one cross-thread call each:
    the shape of a handler thread iterating AsyncLLM.generate. Paced: the generator
    awaits an asyncio.Queue the loop's ticker fills."""

    def __init__(self, shape: Shape, loop: asyncio.AbstractEventLoop, ticker: LoopTicker | None):
        self._shape, self._loop, self._ticker = shape, loop, ticker

    def Generate(self, request: pb.GenerateRequest, context: Any) -> Iterator[pb.GenerateResponse]:
        tokens = self._tokens()
        try:
            for i in range(self._shape.messages):
                asyncio.run_coroutine_threadsafe(_next(tokens), self._loop).result()
                yield self._shape.message(i)
        finally:
            asyncio.run_coroutine_threadsafe(tokens.aclose(), self._loop).result()

    async def _tokens(self) -> AsyncGenerator[int, None]:
        if self._ticker is None:
            for token in itertools.count():
                yield token
            return
        tokens: asyncio.Queue[int] = asyncio.Queue()
        close = self._ticker.open(tokens.put_nowait)
        try:
            while True:
                yield await tokens.get()
        finally:
            close()


async def _next(tokens: AsyncGenerator[int, None]) -> int:
    return await anext(tokens)


def _loop_thread(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    loop = _new_loop(use_uvloop)
    threading.Thread(target=loop.run_forever, daemon=True).start()
    return loop


def _new_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    if use_uvloop:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def _serve_aio(variant: Variant, shape: Shape, ready: Callable[[int], None]) -> None:
    ticker = LoopTicker(shape.step_s) if shape.paced else None
    server = grpc.aio.server(options=list(variant.options))
    pb_grpc.add_InferenceServiceServicer_to_server(
        AioServicer(shape, ticker, variant.write), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    if ticker is not None:
        ticker.start()
    ready(port)
    await server.wait_for_termination()


def _serve_threads(
    variant: Variant, shape: Shape, streams: int, ready: Callable[[int], None]
) -> None:
    servicer: pb_grpc.InferenceServiceServicer
    ticker: ThreadTicker | LoopTicker | None = None
    if variant.kind == "sync":
        ticker = ThreadTicker(shape.step_s) if shape.paced else None
        servicer = SyncServicer(shape, ticker)
    else:
        loop = _loop_thread(variant.uvloop)
        on_loop = LoopTicker(shape.step_s) if shape.paced else None
        if variant.kind == "bridge" and shape.paced:
            servicer = SyncServicer(shape, on_loop)
        else:
            servicer = BridgePullServicer(shape, loop, on_loop)
        ticker = on_loop
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=streams + 8)
    server = grpc.server(pool, options=list(variant.options), maximum_concurrent_rpcs=streams + 8)
    pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    if isinstance(ticker, ThreadTicker):
        ticker.start()
    elif ticker is not None:
        loop.call_soon_threadsafe(ticker.start)
    ready(port)
    server.wait_for_termination()


def serve(name: str, shape: Shape, streams: int) -> None:
    """Serves until killed; prints the port when ready."""
    variant = VARIANTS[name]

    def ready(port: int) -> None:
        print(port, flush=True)

    if variant.kind == "aio":
        loop = _new_loop(variant.uvloop)
        loop.run_until_complete(_serve_aio(variant, shape, ready))
    elif variant.kind in ("grpclib", "grpclib-coalesce", "h2-lean"):
        from bench.front import grpc_floor_h2

        coro = grpc_floor_h2.serve(variant.kind, shape, LoopTicker(shape.step_s), ready)
        _new_loop(variant.uvloop).run_until_complete(coro)
    elif variant.kind == "native":
        from bench.front import grpc_floor_native

        coro = grpc_floor_native.serve(shape, LoopTicker(shape.step_s), ready)
        _new_loop(variant.uvloop).run_until_complete(coro)
    else:
        _serve_threads(variant, shape, streams, ready)
    sys.exit(0)
