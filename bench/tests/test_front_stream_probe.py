"""The stream probe measures a window and lets the requests in flight at its end finish."""

from __future__ import annotations


async def test_the_stream_probe_lets_requests_in_flight_finish_after_its_window() -> None:
    import asyncio
    import os
    from collections.abc import AsyncIterator, Sequence

    from bench.front import stream_probe

    started = finished = 0

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        nonlocal started, finished
        started += 1
        for _ in range(max_tokens):
            await asyncio.sleep(0.01)
            yield 1, 1
        finished += 1

    seen = await stream_probe.measure("fake", call, os.getpid(), 4, 20, 0.1, 0.3)
    assert seen.tokens > 0
    assert started == finished
