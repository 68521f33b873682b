"""FairGate (loraserve.inference.serving.fairness) under a made-up history, for its
tests: requests of each adapter held inside the gate (or waiting for it) until let go,
and the gate a history of arrivals at given rates, each holding its place a while, has
left behind, on a hand-moved clock."""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Callable

from loraserve.inference.serving.fairness import FairGate
from loraserve.testing.fakes.clock import ManualClock


class Holders:
    """Requests held inside a gate (or waiting for it) until let go, each its own task."""

    def __init__(self, gate: FairGate) -> None:
        self.gate = gate
        self._tasks: list[tuple[str, asyncio.Task[None], asyncio.Event]] = []
        self._entered: set[int] = set()

    @property
    def inside(self) -> list[str]:
        """The adapters of the requests inside, in the order they were sent."""
        return [a for i, (a, _, r) in enumerate(self._tasks) if i in self._entered]

    async def send(self, adapter: str) -> asyncio.Task[None]:
        """Sends one request of `adapter`; returns once it is inside or waiting."""
        release = asyncio.Event()
        task = asyncio.create_task(self._hold(len(self._tasks), adapter, release))
        self._tasks.append((adapter, task, release))
        await asyncio.sleep(0)
        return task

    async def _hold(self, index: int, adapter: str, release: asyncio.Event) -> None:
        async with self.gate.turn(adapter):
            self._entered.add(index)
            try:
                await release.wait()
            finally:
                self._entered.discard(index)

    async def let_go(self, adapter: str) -> None:
        """Lets the first request of `adapter` that is inside leave."""
        for index, (name, task, release) in enumerate(self._tasks):
            if name == adapter and index in self._entered:
                release.set()
                await task
                await asyncio.sleep(0)
                return
        raise AssertionError(f"no request of {adapter} inside")

    async def send_all(self, adapters: list[str]) -> None:
        """Sends one request of each of `adapters`, in order."""
        for adapter in adapters:
            await self.send(adapter)

    def adapter(self, index: int) -> str:
        """The adapter of the `index`-th request sent."""
        return self._tasks[index][0]

    @property
    def entered(self) -> set[int]:
        """The indexes of the requests inside."""
        return set(self._entered)

    def task(self, index: int) -> asyncio.Task[None]:
        """The task of the `index`-th request sent."""
        return self._tasks[index][1]

    def release(self, index: int) -> asyncio.Event:
        """The event that lets the `index`-th request sent go."""
        return self._tasks[index][2]

    async def close(self) -> None:
        for _, task, release in self._tasks:
            release.set()
            task.cancel()
        await asyncio.gather(*(t for _, t, _ in self._tasks), return_exceptions=True)


# Seconds a request holds its place: one for all, one per adapter, or one of the number
# of requests inside as it got in (an engine whose steps slow as the batch grows).
Hold = float | dict[str, float] | Callable[[int], float]


async def history(
    gate: FairGate,
    clock: ManualClock,
    rates: dict[str, float],
    seconds: float,
    hold_s: Hold = 0.0,
) -> dict[str, int]:
    """Each adapter's requests come to the gate at `rates` per second, evenly spaced,
    for `seconds`, each leaving `hold_s` (its adapter's there, or `hold_s` of the
    requests inside as it got in) after it got in; what is still inside or waiting at
    the end is cancelled, and the clock ends `seconds` later. Returns the most requests
    each adapter held inside at once."""
    start = clock.now
    end = start + seconds
    # (time, 0 for a departure so that it goes first, index sent, adapter)
    events: list[tuple[float, int, int, str]] = [
        (start + (k + 0.5) / rate, 1, 0, adapter)
        for adapter, rate in rates.items()
        for k in range(int(rate * seconds))
    ]
    heapq.heapify(events)
    holders = Holders(gate)
    leaving: set[int] = set()
    peaks: dict[str, int] = {}
    while events and events[0][0] <= end:
        clock.now, kind, index, adapter = heapq.heappop(events)
        if kind:
            await holders.send(adapter)
        else:
            holders.release(index).set()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        for entered in holders.entered - leaving:
            leaving.add(entered)
            if isinstance(hold_s, float):
                held = hold_s
            elif isinstance(hold_s, dict):
                held = hold_s[holders.adapter(entered)]
            else:
                held = hold_s(gate.inside)
            heapq.heappush(events, (clock.now + held, 0, entered, ""))
        for adapter, count in Counter(map(holders.adapter, holders.entered)).items():
            peaks[adapter] = max(peaks.get(adapter, 0), count)
    clock.now = end
    await holders.close()
    return peaks


async def gate_after(
    *phases: tuple[dict[str, float], float] | tuple[dict[str, float], float, Hold],
    capacity: int = 4,
    headroom: int = 2,
    weights: dict[str, float] | None = None,
) -> Holders:
    """Holders over a fresh gate whose history is `phases`: (rates, seconds) each, or
    (rates, seconds, seconds each request holds its place)."""
    clock = ManualClock()
    known = weights or {}
    gate = FairGate(capacity, lambda a: known.get(a, 1.0), headroom, clock)
    for rates, seconds, *hold in phases:
        await history(gate, clock, rates, seconds, *hold)
    return Holders(gate)
