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
    gate = FairGate(1, lambda a: weights.get(a, 1.0))
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


class _Holders:
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

    def task(self, index: int) -> asyncio.Task[None]:
        """The task of the `index`-th request sent."""
        return self._tasks[index][1]

    async def close(self) -> None:
        for _, task, release in self._tasks:
            release.set()
            task.cancel()
        await asyncio.gather(*(t for _, t, _ in self._tasks), return_exceptions=True)


async def test_an_adapter_below_its_share_is_admitted_at_once_while_another_floods() -> None:
    holders = _Holders(FairGate(4, lambda _: 1.0, headroom=1))
    for _ in range(6):
        await holders.send("flood")
    await holders.send("b")
    # Work-conserving round-robin gave the flood all four places and b waited.
    assert sorted(holders.inside) == ["b", "flood", "flood", "flood"]
    assert holders.gate.waiting == 3
    await holders.close()


async def test_the_headroom_is_never_taken_by_an_adapter_at_its_share() -> None:
    holders = _Holders(FairGate(4, lambda _: 1.0, headroom=2))
    for adapter in ["a", "a", "b", "a"]:
        await holders.send(adapter)
    # a holds its share (2 of 4 between a and b): its third waits beside a free place.
    assert sorted(holders.inside) == ["a", "a", "b"]
    assert (holders.gate.inside, holders.gate.waiting) == (3, 1)
    await holders.close()


async def test_a_lone_adapter_uses_all_but_the_headroom() -> None:
    holders = _Holders(FairGate(4, lambda _: 1.0, headroom=1))
    for _ in range(5):
        await holders.send("a")
    assert (holders.gate.inside, holders.gate.waiting) == (3, 2)
    await holders.close()


async def test_a_waiter_at_its_share_goes_in_when_a_place_below_the_headroom_frees() -> None:
    holders = _Holders(FairGate(4, lambda _: 1.0, headroom=1))
    for _ in range(4):
        await holders.send("a")
    await holders.let_go("a")
    assert (holders.gate.inside, holders.gate.waiting) == (3, 0)
    await holders.close()


async def test_weights_set_the_share_below_which_the_headroom_may_be_taken() -> None:
    weights = {"heavy": 3.0, "light": 1.0}
    holders = _Holders(FairGate(6, lambda a: weights[a], headroom=2))
    for adapter in ["heavy", "heavy", "heavy", "light", "heavy", "heavy"]:
        await holders.send(adapter)
    # heavy's share is 4.5 of 6 (equal weights: 3), kept to 6 - 2 so the headroom
    # stays for another adapter: its fourth request goes in, its fifth waits.
    assert sorted(holders.inside) == ["heavy"] * 4 + ["light"]
    assert holders.gate.waiting == 1
    await holders.close()


async def test_headroom_of_the_whole_capacity_still_lets_one_request_in() -> None:
    holders = _Holders(FairGate(2, lambda _: 1.0, headroom=5))
    await holders.send("a")
    await holders.send("a")
    assert (holders.gate.inside, holders.gate.waiting) == (1, 1)
    await holders.close()


async def test_a_waiter_cancelled_while_the_engine_is_full_leaves_the_shares() -> None:
    holders = _Holders(FairGate(6, lambda _: 1.0, headroom=2))
    for adapter in ["a", "a", "b", "b", "c", "c", "x", "a"]:
        await holders.send(adapter)
    gone = holders.task(6)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert (holders.gate.inside, holders.gate.waiting) == (6, 1)
    await holders.let_go("c")
    await holders.let_go("c")
    # Between a and b alone a's share is 3 of 6: its third request takes a place in
    # the headroom (had x stayed in the shares, a's would be 2 and it would wait).
    assert sorted(holders.inside) == ["a", "a", "a", "b", "b"]
    assert holders.gate.waiting == 0
    await holders.close()


async def test_a_request_admitted_into_the_headroom_as_it_is_cancelled_passes_its_place_on() -> (
    None
):
    gate = FairGate(2, lambda _: 1.0, headroom=1)
    holders = _Holders(gate)
    await holders.send("a")
    async with gate.turn("b"):
        await holders.send("a")
        cancelled = await holders.send("c")
        after = await holders.send("d")
    # b's place went to c (below its share; a holds its own): c is cancelled before it
    # runs, and the place goes to d, not to a beyond its share.
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    await asyncio.sleep(0)
    assert not after.done()
    assert sorted(holders.inside) == ["a", "d"]
    assert (gate.inside, gate.waiting) == (2, 1)
    await holders.close()
