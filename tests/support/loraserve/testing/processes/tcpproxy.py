"""A TCP proxy on 127.0.0.1 that a test can cut, to break live connections on demand.

Put it between a client and a server to simulate a network failure: `cut()` drops
every open connection and refuses new ones until `restore()`, while the server
itself keeps running. `cut_at_first_message()` drops the connection that carries a
gRPC response's first message just before that message, after its headers: what a
client sees when a server dies the moment it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

log = logging.getLogger(__name__)

_BUFFER = 64 * 1024
# HTTP/2 (RFC 9113 4.1): a 9-byte frame header, its type in byte 3; DATA is type 0.
_FRAME_HEADER = 9
_DATA = 0


class TcpProxy:
    """Forwards connections from `port` to `target_port` on 127.0.0.1."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusing = False
        self.port = 0
        # Connections accepted and forwarded so far.
        self.connections = 0
        self._cut_at_message = False
        # Connections dropped by `cut_at_first_message`.
        self.cut_at_message = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Drops every open connection and refuses new ones."""
        self._refusing = True
        for writer in list(self._writers):
            writer.transport.abort()
        log.info("tcpproxy.cut port=%d", self.port)

    def cut_at_first_message(self) -> None:
        """Once: of the connections opened from now on, drops the first to carry a DATA
        frame from the server, just before that frame (its stream's headers went through)."""
        self._cut_at_message = True

    def restore(self) -> None:
        """Accepts connections again."""
        self._refusing = False
        log.info("tcpproxy.restored port=%d", self.port)

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._writers.update((writer, up_writer))
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe_down(up_reader, writer)),
        ]
        self._tasks.update(pipes)
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
                self._tasks.discard(pipe)
            for side in (writer, up_writer):
                side.transport.abort()
                self._writers.discard(side)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(_BUFFER):
                writer.write(data)
                await writer.drain()

    async def _pipe_down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Server to client: whole frames while `cut_at_first_message` is armed."""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while self._cut_at_message:
                header = await reader.readexactly(_FRAME_HEADER)
                body = await reader.readexactly(int.from_bytes(header[:3], "big"))
                if header[3] == _DATA and self._cut_at_message:
                    self._cut_at_message = False
                    self.cut_at_message += 1
                    log.info("tcpproxy.cut_at_message port=%d", self.port)
                    return
                writer.write(header + body)
                await writer.drain()
        await self._pipe(reader, writer)


@asynccontextmanager
async def tcp_proxy(target_port: int) -> AsyncIterator[TcpProxy]:
    """A running proxy to `target_port`, closed when the block exits."""
    proxy = TcpProxy(target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
