"""bench/front/grpc_floor.py's `native` server: the messages made on the event loop as in
every other variant, the transport the service's native one (loraserve.inference.transport:
Rust's h2 on a Tokio thread; `make native` builds it).

Each loop pass's messages cross into Rust in one call; h2 then writes every stream's
frames of a connection in one socket write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from bench.front.grpc_floor_servers import GENERATE, AioServicer, LoopTicker, Shape
from loraserve.inference.transport.native import Metadata, NativeFront, Write


async def serve(shape: Shape, ticker: LoopTicker, ready: Callable[[int], None]) -> None:
    """Serves until killed; `ready(port)` once listening."""
    servicer = AioServicer(shape, ticker if shape.paced else None, write=False)

    async def generate(request: bytes, metadata: Metadata, write: Write) -> None:
        async for message in servicer._yielded(None, None):
            write(message.SerializeToString())

    front = NativeFront(generate, path=GENERATE)
    if shape.paced:
        ticker.start()
    ready(front.port)
    await asyncio.Event().wait()
