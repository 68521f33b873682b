"""Running any gRPC aio servicer on 127.0.0.1, port 0, for a test; reading a stream."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import grpc

from loraserve.common.rpc.security import ServerSecurity
from loraserve.common.rpc.server import RunningServer, start_server


@asynccontextmanager
async def serving(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    security: ServerSecurity | None = None,
    write_methods: Iterable[str] = (),
    replica_methods: Iterable[str] = (),
) -> AsyncIterator[RunningServer]:
    """Runs a server on a free loopback port, SERVING, until the block exits."""
    running = await start_server(
        address="127.0.0.1:0",
        register=register,
        service_names=service_names,
        security=security or ServerSecurity(),
        write_methods=write_methods,
        replica_methods=replica_methods,
    )
    await running.set_serving(True)
    try:
        yield running
    finally:
        await running.stop(grace=None)


async def messages(call: AsyncIterable[Any]) -> list[Any]:
    """Every message of a server stream, once it has ended."""
    return [message async for message in call]


# Generate streams a test starts before concluding that the server merges every one whole.
MERGED_TRIES = 5


async def running_stream(start: Callable[[], Any]) -> tuple[Any, Any, int]:
    """A Generate call (made by `start`) still running after its first message, that
    message, and how many calls before it ran to their end. Under load vLLM merges the
    chunks a lagging reader has not taken, so a stream's first message may already be its
    last: such a call is read to its end and another one started."""
    for ended in range(MERGED_TRIES):
        call = start()
        first = await anext(aiter(call))
        if not first.finish_reason:
            return call, first, ended
        await messages(call)
    raise AssertionError(f"{MERGED_TRIES} streams each ended with their first message")
