"""Reading a server stream in a test: a gRPC Generate call or an OpenAI SDK stream."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, Callable
from typing import Any

# Streams a test starts before concluding that the server merges every one whole.
MERGED_TRIES = 5


async def messages(stream: AsyncIterable[Any]) -> list[Any]:
    """Every message of a server stream, once it has ended."""
    return [message async for message in stream]


def _generate_finished(first: Any) -> bool:
    return bool(first.finish_reason)


async def running_stream(
    start: Callable[[], Any], finished: Callable[[Any], bool] = _generate_finished
) -> tuple[Any, int]:
    """A stream (made, or awaited, by `start`) still running after its first message, and
    how many streams before it ran to their end. Under load vLLM merges the chunks a
    lagging reader has not taken, so a stream's first message may already be its last
    (`finished` says, by default of a GenerateResponse): such a stream is read to its end
    and another one started."""
    for ended in range(MERGED_TRIES):
        stream = start()
        if inspect.isawaitable(stream):
            stream = await stream
        if not finished(await anext(aiter(stream))):
            return stream, ended
        await messages(stream)
    raise AssertionError(f"{MERGED_TRIES} streams each ended with their first message")
