"""Fair admission into the engine (FairGate): once saturated, waiting requests go in by
weighted round-robin over adapters, not first come first served."""

from __future__ import annotations

import asyncio

from loraserve.inference.serving.fairness import FairGate


async def _queue(gate: FairGate, order: list[str], adapter: str, release: asyncio.Event) -> None:
    async with gate.turn(adapter):
        order.append(adapter)
        await release.wait()


async def _admitted_in_order(gate: FairGate, arrivals: list[str]) -> list[str]:
    """Fills the gate with one blocker, queues `arrivals` in order, then lets the
    blocker and each admitted request go one at a time; the order they got in."""
    blocker_release = asyncio.Event()
    order: list[str] = []
    blocker = asyncio.create_task(_queue(gate, [], "blocker", blocker_release))
    await asyncio.sleep(0)
    releases = {i: asyncio.Event() for i in range(len(arrivals))}
    tasks = [
        asyncio.create_task(_queue(gate, order, adapter, releases[i]))
        for i, adapter in enumerate(arrivals)
    ]
    await asyncio.sleep(0)
    assert gate.waiting == len(arrivals)
    blocker_release.set()
    await blocker
    for _ in arrivals:
        await asyncio.sleep(0)
        # Let out whoever got in last; the next one takes its place.
        admitted = len(order) - 1
        releases[_index_of(arrivals, order, admitted)].set()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return order


def _index_of(arrivals: list[str], order: list[str], position: int) -> int:
    """Which arrival got in at `position` of `order` (arrivals of one adapter go in
    their arrival order)."""
    adapter = order[position]
    nth = order[: position + 1].count(adapter)
    seen = 0
    for i, arrival in enumerate(arrivals):
        if arrival == adapter:
            seen += 1
            if seen == nth:
                return i
    raise AssertionError(f"{adapter} admitted more often than it arrived")


async def test_below_capacity_nothing_waits() -> None:
    gate = FairGate(2, lambda _: 1.0)
    async with gate.turn("a"), gate.turn("a"):
        assert (gate.inside, gate.waiting) == (2, 0)


async def test_a_flood_on_one_adapter_does_not_hold_back_the_others() -> None:
    gate = FairGate(1, lambda _: 1.0)
    arrivals = ["flood"] * 6 + ["b", "c"]
    order = await _admitted_in_order(gate, arrivals)
    # First come first served would admit b and c last; round-robin takes them
    # in the first round.
    assert order[:3] == ["flood", "b", "c"]
    assert order.count("flood") == 6


async def test_weights_give_adapters_turns_in_proportion() -> None:
    weights = {"heavy": 2.0, "light": 1.0}
    gate = FairGate(1, lambda a: weights[a])
    order = await _admitted_in_order(gate, ["heavy"] * 6 + ["light"] * 3)
    assert order[:6].count("heavy") == 4
    assert order[:6].count("light") == 2


async def test_a_cancelled_waiter_leaves_the_queue_and_its_turn_goes_to_the_next() -> None:
    gate = FairGate(1, lambda _: 1.0)
    release = asyncio.Event()
    order: list[str] = []
    holder = asyncio.create_task(_queue(gate, order, "a", release))
    await asyncio.sleep(0)
    gone = asyncio.create_task(_queue(gate, order, "b", asyncio.Event()))
    after = asyncio.create_task(_queue(gate, order, "c", release))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert gate.waiting == 1
    release.set()
    await asyncio.gather(holder, after)
    assert order == ["a", "c"]
    assert (gate.inside, gate.waiting) == (0, 0)
