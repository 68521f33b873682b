"""Fair admission into the engine (FairGate): once saturated, waiting requests go in by
weighted round-robin over adapters, not first come first served; a request takes a place
per sequence, and turns share sequences, not requests. The headroom kept from an adapter
over its fair rate is tested in test_fair_gate_headroom.py, the places kept from a flood
for the others in test_fair_gate_floods.py."""

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
    gate = FairGate(1, lambda a: weights.get(a, 1.0))
    order = await _admitted_in_order(gate, ["heavy"] * 6 + ["light"] * 3)
    assert order[:6].count("heavy") == 4
    assert order[:6].count("light") == 2


async def _a_holds_while_b_and_c_wait(
    gate: FairGate,
) -> tuple[list[str], asyncio.Event, tuple[asyncio.Task[None], ...]]:
    """a takes the one place of `gate`, then b and c wait for it. Returns the order they
    get in, the event that lets a and c go, and the tasks of a, b and c."""
    release = asyncio.Event()
    order: list[str] = []
    holder = asyncio.create_task(_queue(gate, order, "a", release))
    await asyncio.sleep(0)
    gone = asyncio.create_task(_queue(gate, order, "b", asyncio.Event()))
    after = asyncio.create_task(_queue(gate, order, "c", release))
    await asyncio.sleep(0)
    return order, release, (holder, gone, after)


async def test_a_cancelled_waiter_leaves_the_queue_and_its_turn_goes_to_the_next() -> None:
    gate = FairGate(1, lambda _: 1.0)
    order, release, (holder, gone, after) = await _a_holds_while_b_and_c_wait(gate)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert gate.waiting == 1
    release.set()
    await asyncio.gather(holder, after)
    assert order == ["a", "c"]
    assert (gate.inside, gate.waiting) == (0, 0)


async def test_a_waiter_cancelled_as_a_place_frees_is_passed_over() -> None:
    gate = FairGate(1, lambda _: 1.0)
    order, release, (holder, gone, after) = await _a_holds_while_b_and_c_wait(gate)
    # a leaves before b's task has run to see its cancellation.
    release.set()
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    await asyncio.gather(holder, after)
    assert order == ["a", "c"]
    assert (gate.inside, gate.waiting) == (0, 0)


async def _wide(gate: FairGate, order: list[str], adapter: str, n: int, go: asyncio.Event) -> None:
    async with gate.turn(adapter, n):
        order.append(adapter)
        await go.wait()


async def test_a_request_takes_a_place_per_sequence() -> None:
    gate = FairGate(4, lambda _: 1.0)
    async with gate.turn("a", 3):
        assert gate.inside == 3
        order: list[str] = []
        waiter = asyncio.create_task(_wide(gate, order, "b", 2, asyncio.Event()))
        await asyncio.sleep(0)
        assert (gate.inside, gate.waiting, order) == (3, 1, [])
    await asyncio.sleep(0)
    assert (gate.inside, order) == (2, ["b"])
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


async def test_a_request_wider_than_the_engine_takes_all_of_it_and_still_goes_in() -> None:
    gate = FairGate(2, lambda _: 1.0)
    async with gate.turn("a", 8):
        assert gate.inside == 2
    assert gate.inside == 0


async def test_narrow_requests_arriving_later_do_not_pass_a_wide_one_waiting_for_room() -> None:
    gate = FairGate(4, lambda _: 1.0)
    order: list[str] = []
    holder_go, wide_go, narrow_go = asyncio.Event(), asyncio.Event(), asyncio.Event()
    holder = asyncio.create_task(_wide(gate, order, "a", 3, holder_go))
    await asyncio.sleep(0)
    wide = asyncio.create_task(_wide(gate, order, "wide", 4, wide_go))
    await asyncio.sleep(0)
    narrow = asyncio.create_task(_wide(gate, order, "narrow", 1, narrow_go))
    await asyncio.sleep(0)
    # One place is free, but the wide request's turn came first.
    assert order == ["a"]
    holder_go.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert order == ["a", "wide"]
    wide_go.set()
    narrow_go.set()
    await asyncio.gather(holder, wide, narrow)
    assert order == ["a", "wide", "narrow"]


async def test_turns_share_sequences_not_requests_between_adapters() -> None:
    gate = FairGate(2, lambda _: 1.0)
    order: list[str] = []
    blocker_go = asyncio.Event()
    blocker = asyncio.create_task(_wide(gate, [], "blocker", 2, blocker_go))
    await asyncio.sleep(0)
    goes = [asyncio.Event() for _ in range(6)]
    arrivals = [("pairs", 2)] * 3 + [("singles", 1)] * 3
    tasks = [
        asyncio.create_task(_wide(gate, order, adapter, n, go))
        for (adapter, n), go in zip(arrivals, goes, strict=True)
    ]
    await asyncio.sleep(0)
    blocker_go.set()
    for go in goes:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        go.set()
    await asyncio.gather(blocker, *tasks)
    # Per request, pairs would take every other turn and get twice the sequences.
    assert order[:3].count("singles") == 2
