"""Native fronts (loraserve.inference.transport.native) for the transport's own tests:
handlers without an engine, and a grpc.aio server upstream of raw-bytes methods."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from loraserve.inference.serving import GENERATE_METHOD
from loraserve.inference.transport.native import Handler, Metadata, NativeFront, Write
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc


def native_front(handler: Handler, *args: Any, **options: Any) -> NativeFront:
    """A native front serving `handler` at Generate's path."""
    return NativeFront(handler, *args, path=GENERATE_METHOD, **options)


async def forever(request: bytes, metadata: Metadata, write: Write) -> None:
    """A handler that writes "x", then waits until cancelled."""
    write(pb.GenerateResponse(text="x").SerializeToString())
    await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def front_watching_cancels(**options: Any) -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A native front (made with `options`) whose handler writes one message, then waits
    until cancelled; the event is set once it has been."""
    cancelled = asyncio.Event()

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        try:
            await forever(request, metadata, write)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    front = native_front(handler, **options)
    try:
        yield front.port, cancelled
    finally:
        front.close()


@contextlib.asynccontextmanager
async def front_watching_starts() -> AsyncIterator[tuple[int, asyncio.Event, asyncio.Event]]:
    """A native front whose handler writes nothing and waits until cancelled: its port, and
    events set once a handler has started and once one has been cancelled."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    front = native_front(handler)
    try:
        yield front.port, started, cancelled
    finally:
        front.close()


def recording(seen: list[tuple[bytes, Metadata]]) -> Handler:
    """A handler that records each call's request and metadata in `seen`, and ends the
    call at once with no message."""

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        seen.append((request, metadata))

    return handler


@contextlib.asynccontextmanager
async def recording_stub() -> AsyncIterator[tuple[Any, list[tuple[bytes, Metadata]]]]:
    """A stub on a native front whose handler records each call's request and metadata,
    and ends it at once with no message."""
    seen: list[tuple[bytes, Metadata]] = []
    front = native_front(recording(seen))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            yield pb_grpc.InferenceServiceStub(channel), seen
    finally:
        front.close()


def x_then_y(go_on: asyncio.Event) -> Handler:
    """A handler that writes "x", waits for `go_on`, then writes "y"."""

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        write(pb.GenerateResponse(text="x").SerializeToString())
        await go_on.wait()
        write(pb.GenerateResponse(text="y").SerializeToString())

    return handler


async def first_text(channel: grpc.aio.Channel) -> str:
    """The text of a Generate call's first message (the call is then cancelled)."""
    call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=30)
    first = await call.read()
    call.cancel()
    return str(first.text)


class Upstream:
    """A grpc.aio server of raw-bytes methods under /test.Echo/, standing for the
    service's own server behind the native transport."""

    def __init__(self) -> None:
        # Set once a Hang or a Sleep call has begun here.
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.metadata: list[tuple[str, str]] = []
        # The time a Hang call had left here as it began (None: it had no deadline).
        self.time_remaining: float | None = None
        self.server: grpc.aio.Server | None = None

    async def chat(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        seen = 0
        async for request in requests:
            seen += 1
            yield request
        context.set_trailing_metadata((("x-seen", str(seen)),))

    async def fail(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        context.set_trailing_metadata((("x-why", "asked to"),))
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing: ü")

    async def hang(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        metadata = context.invocation_metadata() or ()
        self.metadata = [(k, str(v)) for k, v in metadata if k.startswith("x-")]
        self.time_remaining = context.time_remaining()
        self.started.set()
        yield request
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def sleep(self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return request

    async def flood(
        self, request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        for i in range(2000):
            yield bytes([i % 256]) * (64 << 10)

    async def refuse_early(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        async for _ in requests:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "no thanks")
        yield b""

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            "test.Echo",
            {
                "Chat": grpc.stream_stream_rpc_method_handler(self.chat),
                "Fail": grpc.unary_unary_rpc_method_handler(self.fail),
                "Hang": grpc.unary_stream_rpc_method_handler(self.hang),
                "Sleep": grpc.unary_unary_rpc_method_handler(self.sleep),
                "Flood": grpc.unary_stream_rpc_method_handler(self.flood),
                "RefuseEarly": grpc.stream_stream_rpc_method_handler(self.refuse_early),
            },
        )


@contextlib.asynccontextmanager
async def front_before_upstream(
    tls: tuple[Path, Path, Path | None] | None = None, socket_path: Path | None = None
) -> AsyncIterator[tuple[int, Upstream]]:
    """The port of a native front (TLS with `tls`) whose every call but Generate goes to
    an upstream, on loopback TCP or at `socket_path`, a Unix socket."""
    upstream = Upstream()
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((upstream.handler(),))
    if socket_path is None:
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    else:
        address = f"unix:{socket_path}"
        server.add_insecure_port(address)
    await server.start()
    front = native_front(forever, upstream=address, tls=tls)
    upstream.server = server
    try:
        yield front.port, upstream
    finally:
        front.close()
        await server.stop(None)


def echo_method(channel: grpc.aio.Channel, name: str) -> Any:
    """A /test.Echo/ method of `channel`, raw bytes each way."""
    kinds = {
        "Chat": channel.stream_stream,
        "Fail": channel.unary_unary,
        "Hang": channel.unary_stream,
        "Sleep": channel.unary_unary,
        "Flood": channel.unary_stream,
        "RefuseEarly": channel.stream_stream,
    }
    return kinds[name](f"/test.Echo/{name}")
