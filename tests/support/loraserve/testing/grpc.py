"""Running any gRPC aio servicer on 127.0.0.1, port 0, for a test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import grpc

from loraserve.common.rpc.limits import ServerLimits
from loraserve.common.rpc.security import Role, ServerSecurity
from loraserve.common.rpc.server import RunningServer, start_server


@asynccontextmanager
async def serving(
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    security: ServerSecurity | None = None,
    needs: Mapping[str, Role] | None = None,
    limits: ServerLimits | None = None,
) -> AsyncIterator[RunningServer]:
    """Runs a server on a free loopback port, SERVING, until the block exits."""
    running = await start_server(
        address="127.0.0.1:0",
        register=register,
        service_names=service_names,
        security=security or ServerSecurity(),
        needs=needs,
        limits=limits,
    )
    await running.set_serving(True)
    try:
        yield running
    finally:
        await running.stop(grace=None)
