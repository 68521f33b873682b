"""The thinnest way to drive an engine from another process: a loopback TCP server
that takes one request per line and streams back one line per engine delta, no
framing beyond newlines, no validation, no admission. The "engine direct" and
"Generator" arms of benchmarks 1-3 and the raw AsyncLLM arm of 8 are served this way,
so that their load generator runs in its own process like every other arm's.

    client -> {"a": ADAPTER, "p": [PROMPT IDS], "n": MAX_TOKENS}\\n
    server -> COUNT\\n per delta (COUNT: its new tokens), then .\\n; !MESSAGE\\n on failure
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence

from bench.load.workload import Caller

log = logging.getLogger(__name__)
_LIMIT = 1 << 20


async def _serve_connection(
    caller: Caller, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        while line := await reader.readline():
            request = json.loads(line)
            try:
                stream = caller(request["a"], request["p"], int(request["n"]))
                async with contextlib.aclosing(stream):  # type: ignore[type-var]
                    async for count, _ in stream:
                        if writer.is_closing():  # the client gave up: stop the engine too
                            return
                        if count:
                            writer.write(b"%d\n" % count)
                writer.write(b".\n")
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}".replace("\n", " ")
                writer.write(b"!" + message.encode() + b"\n")
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def serve(caller: Caller) -> tuple[asyncio.Server, int]:
    """Serves `caller` on a free loopback port; returns the server and the port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_connection(caller, reader, writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, limit=_LIMIT)
    port: int = server.sockets[0].getsockname()[1]
    return server, port


class ThinError(RuntimeError):
    """The engine behind a thin server failed a request."""


class ThinClient:
    """Connections to one thin server, reused across requests (one per stream in flight)."""

    def __init__(self, address: str) -> None:
        host, _, port = address.rpartition(":")
        self._host, self._port = host, int(port)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._open: set[asyncio.StreamWriter] = set()

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._idle:
            return self._idle.pop()
        reader, writer = await asyncio.open_connection(self._host, self._port, limit=_LIMIT)
        self._open.add(writer)
        return reader, writer

    async def stream(
        self, adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        reader, writer = await self._connection()
        done = False
        try:
            request = {"a": adapter, "p": list(prompt), "n": max_tokens}
            writer.write(json.dumps(request).encode() + b"\n")
            while True:
                line = await reader.readline()
                if not line:
                    raise ThinError("the thin server closed the connection")
                if line == b".\n":
                    done = True
                    return
                if line.startswith(b"!"):
                    done = True
                    raise ThinError(line[1:].decode(errors="replace").strip())
                yield int(line), 0
        finally:
            if done:
                self._idle.append((reader, writer))
            else:  # abandoned mid-stream: the rest of its lines would confuse a reuse
                self._open.discard(writer)
                writer.close()

    async def close(self) -> None:
        for writer in self._open:
            writer.close()
        self._open.clear()
        self._idle.clear()
