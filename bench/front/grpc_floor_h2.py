"""bench/front/grpc_floor.py's pure-Python HTTP/2 servers, on the event loop that makes the tokens.

`grpclib`: the grpclib server (h2 underneath), one socket write per message as it ships.
`grpclib-coalesce`: the same, its transport wrapped so that every write made during one
event-loop pass leaves in one socket write (a step's 32 messages: one send).
`h2-lean`: no gRPC library at all: h2's state machine, each message framed by hand
(5-byte prefix) and written with h2's send_data, writes coalesced the same way, trailers
`grpc-status: 0`. It reads no metadata, honours no deadline and maps no error: the floor
any Python HTTP/2 server pays per message, not a server to ship.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from bench.front.grpc_floor_servers import GENERATE, AioServicer, LoopTicker, Shape
from loraserve.inference.v1 import inference_pb2 as pb


class CoalescingTransport:
    """A transport whose writes within one event-loop pass leave in one socket write:
    a step's messages to every stream of a connection cost one send, not one each."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(b"".join(pending))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def coalesce_grpclib_writes() -> None:
    """Makes every grpclib connection of this process write through a CoalescingTransport
    (once: a second call changes nothing)."""
    from grpclib.protocol import H2Protocol

    made = H2Protocol.connection_made
    if getattr(made, "coalesces", False):
        return

    def connection_made(self: Any, transport: Any) -> None:
        made(self, cast(asyncio.BaseTransport, CoalescingTransport(transport)))

    connection_made.coalesces = True  # type: ignore[attr-defined]
    H2Protocol.connection_made = connection_made  # type: ignore[method-assign]


async def _serve_grpclib(messages: Callable[[], AsyncIterator[Any]]) -> tuple[Any, int]:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server, Stream

    class Service:
        def __mapping__(self) -> dict[str, Handler]:
            return {
                GENERATE: Handler(
                    self.generate, Cardinality.UNARY_STREAM, pb.GenerateRequest, pb.GenerateResponse
                )
            }

        async def generate(self, stream: Stream[Any, Any]) -> None:
            await stream.recv_message()
            async for message in messages():
                await stream.send_message(message)

    server = Server([Service()])
    await server.start("127.0.0.1", 0)
    return server, server._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


class LeanGrpcProtocol(asyncio.Protocol):
    """Server-streaming gRPC over h2 and nothing else (see the module's docstring)."""

    def __init__(self, messages: Callable[[], AsyncIterator[Any]]) -> None:
        import h2.config
        import h2.connection

        self._messages = messages
        self._h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._window = asyncio.Event()

    def connection_made(self, transport: Any) -> None:
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport = CoalescingTransport(transport)
        self._h2.initiate_connection()
        self._transport.write(self._h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        import h2.events as ev

        for event in self._h2.receive_data(data):
            if isinstance(event, ev.DataReceived):
                self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, ev.StreamEnded):
                task = asyncio.get_running_loop().create_task(self._respond(event.stream_id))
                self._tasks[event.stream_id] = task
                task.add_done_callback(functools.partial(self._forget, event.stream_id))
            elif isinstance(event, ev.WindowUpdated):
                self._window.set()
            elif isinstance(event, ev.StreamReset) and event.stream_id in self._tasks:
                self._tasks[event.stream_id].cancel()
        self._transport.write(self._h2.data_to_send())

    def _forget(self, stream_id: int, _: object) -> None:
        self._tasks.pop(stream_id, None)

    async def _respond(self, stream_id: int) -> None:
        import h2.exceptions

        conn = self._h2
        try:
            conn.send_headers(
                stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")]
            )
            async for message in self._messages():
                payload = message.SerializeToString()
                framed = b"\x00" + len(payload).to_bytes(4, "big") + payload
                while conn.local_flow_control_window(stream_id) < len(framed):
                    self._window.clear()
                    await self._window.wait()
                conn.send_data(stream_id, framed)
                self._transport.write(conn.data_to_send())
            conn.send_headers(stream_id, [(b"grpc-status", b"0")], end_stream=True)
            self._transport.write(conn.data_to_send())
        except h2.exceptions.StreamClosedError:
            return

    def connection_lost(self, exc: Exception | None) -> None:
        for task in list(self._tasks.values()):
            task.cancel()


async def serve(kind: str, shape: Shape, ticker: LoopTicker, ready: Callable[[int], None]) -> None:
    """Serves `kind` until killed; `ready(port)` once listening."""
    servicer = AioServicer(shape, ticker if shape.paced else None, write=False)

    def messages() -> AsyncIterator[Any]:
        return servicer._yielded(None, None)

    if kind == "h2-lean":
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: LeanGrpcProtocol(messages), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
    else:
        if kind == "grpclib-coalesce":
            coalesce_grpclib_writes()
        server, port = await _serve_grpclib(messages)
    if shape.paced:
        ticker.start()
    ready(port)
    await asyncio.Event().wait()
