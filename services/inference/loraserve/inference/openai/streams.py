"""Several Generate streams (one per prompt of an OpenAI request) read as one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")


async def merged(streams: Sequence[AsyncIterator[T]]) -> AsyncGenerator[tuple[int, T], None]:
    """Items of every stream as they come, with the stream's position; an error in one
    stream ends the whole. The caller closes the streams."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    pending: dict[asyncio.Future[T], int] = {
        asyncio.ensure_future(anext(stream)): i for i, stream in enumerate(streams)
    }
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                position = pending.pop(task)
                try:
                    item = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(streams[position]))] = position
                yield position, item
    finally:
        for task in pending:
            task.cancel()
        # The cancels must land (and the engine requests end) before the caller goes on.
        if pending:
            await asyncio.wait(pending)


async def firsts(streams: Sequence[AsyncIterator[T]]) -> list[T]:
    """Each stream's first item, awaited together; an error from any is raised."""
    tasks = [asyncio.ensure_future(anext(stream)) for stream in streams]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)


async def resumed(first: T, rest: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """`first`, then what `rest` yields."""
    yield first
    async for item in rest:
        yield item


def close_all(streams: Sequence[AsyncGenerator[T, None]]) -> asyncio.Future[list[None]]:
    """Closes every stream (aborting its engine request)."""
    return asyncio.gather(*(stream.aclose() for stream in streams))
