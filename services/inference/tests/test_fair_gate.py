"""Fair admission into the engine (FairGate): once saturated, waiting requests go in by
weighted round-robin over adapters, not first come first served."""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Callable

from loraserve.inference.serving.fairness import FairGate
from loraserve.testing.fakes.clock import ManualClock


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


async def _history(
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
    holders = _Holders(gate)
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


# A flood: `flood` at 10 requests/s, b and c at 1/s.
FLOOD = {"flood": 10.0, "b": 1.0, "c": 1.0}


async def _after(
    *phases: tuple[dict[str, float], float] | tuple[dict[str, float], float, Hold],
    capacity: int = 4,
    headroom: int = 2,
    weights: dict[str, float] | None = None,
) -> _Holders:
    """Holders over a fresh gate whose history is `phases`: (rates, seconds) each, or
    (rates, seconds, seconds each request holds its place)."""
    clock = ManualClock()
    known = weights or {}
    gate = FairGate(capacity, lambda a: known.get(a, 1.0), headroom, clock)
    for rates, seconds, *hold in phases:
        await _history(gate, clock, rates, seconds, *hold)
    return _Holders(gate)


async def test_adapters_at_their_fair_rate_share_the_whole_engine() -> None:
    holders = await _after(({"a": 1.0, "b": 1.0}, 20.0))
    await holders.send_all(["a", "a", "b", "a"])
    # No one is over its rate: a's third request takes a place in the headroom.
    assert sorted(holders.inside) == ["a", "a", "a", "b"]
    assert holders.gate.waiting == 0
    await holders.close()


async def test_an_adapter_admitted_above_its_fair_rate_is_kept_out_of_the_headroom() -> None:
    holders = await _after((FLOOD, 20.0))
    await holders.send_all(["flood"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (2, 2)
    await holders.close()


async def test_another_adapters_request_finds_a_free_place_during_a_flood() -> None:
    holders = await _after((FLOOD, 20.0))
    await holders.send_all(["flood"] * 4 + ["b", "d"])
    assert sorted(holders.inside) == ["b", "d", "flood", "flood"]
    assert holders.gate.waiting == 2
    await holders.close()


async def test_a_lone_adapter_is_never_over_its_share() -> None:
    holders = await _after(({"a": 50.0}, 20.0))
    await holders.send_all(["a"] * 5)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 1)
    await holders.close()


async def test_an_adapter_that_stops_flooding_gets_the_headroom_back_as_its_rate_decays() -> None:
    # After the flood every adapter at the same rate: flood's decays towards theirs.
    holders = await _after((FLOOD, 20.0), ({"flood": 1.0, "b": 1.0, "c": 1.0}, 30.0))
    await holders.send_all(["flood"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 0)
    await holders.close()


async def test_an_adapter_quiet_for_a_while_no_longer_shares_the_fair_rate() -> None:
    # b and c stop: a, alone since, is the only adapter sharing the total.
    holders = await _after(({"a": 2.0, "b": 1.0, "c": 1.0}, 20.0), ({"a": 2.0}, 12.0))
    await holders.send_all(["a"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 0)
    await holders.close()


async def test_weights_set_the_fair_rate_above_which_the_headroom_is_kept() -> None:
    # heavy at 5 of every 6 admissions: over 1.5x an equal share, at its weighted one.
    rates = {"heavy": 5.0, "light": 1.0}
    holders = await _after((rates, 20.0), weights=rates)
    await holders.send_all(["heavy"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (4, 0)
    await holders.close()


async def test_an_over_adapters_waiter_goes_in_when_a_place_below_the_headroom_frees() -> None:
    holders = await _after((FLOOD, 20.0), headroom=1)
    await holders.send_all(["flood"] * 4)
    assert (holders.gate.inside, holders.gate.waiting) == (3, 1)
    await holders.let_go("flood")
    assert (holders.gate.inside, holders.gate.waiting) == (3, 0)
    await holders.close()


async def test_headroom_of_the_whole_capacity_still_lets_an_over_adapter_in() -> None:
    holders = await _after((FLOOD, 20.0), capacity=2, headroom=5)
    await holders.send_all(["flood"] * 2)
    assert (holders.gate.inside, holders.gate.waiting) == (1, 1)
    await holders.close()


async def test_a_cancelled_waiter_of_an_over_adapter_leaves_the_free_place_to_others() -> None:
    holders = await _after((FLOOD, 20.0))
    await holders.send_all(["flood"] * 4)
    gone = holders.task(3)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert (holders.gate.inside, holders.gate.waiting) == (2, 1)
    await holders.send_all(["b", "c"])
    assert sorted(holders.inside) == ["b", "c", "flood", "flood"]
    assert holders.gate.waiting == 1
    await holders.close()


async def test_a_request_admitted_into_the_headroom_as_it_is_cancelled_passes_its_place_on() -> (
    None
):
    holders = await _after((FLOOD, 20.0), capacity=2, headroom=1)
    gate = holders.gate
    await holders.send("flood")
    async with gate.turn("b"):
        await holders.send("flood")
        cancelled = await holders.send("c")
        after = await holders.send("d")
    # b's place is headroom: it went to c (flood is over its rate); c is cancelled
    # before it runs, and the place goes to d, not to flood.
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    await asyncio.sleep(0)
    assert not after.done()
    assert sorted(holders.inside) == ["d", "flood"]
    assert (gate.inside, gate.waiting) == (2, 1)
    await holders.close()


# Seven adapters each holding about one place (2 requests/s of 0.5 s), and `flood` at
# 10x their rate: over its fair rate, and with it they ask for more than 16 places.
BUSY = {"flood": 20.0, **{name: 2.0 for name in "abcdefg"}}


async def test_places_the_other_adapters_are_expected_to_need_are_kept_from_a_flood() -> None:
    holders = await _after((BUSY, 60.0, 0.5), capacity=16)
    await holders.send_all(["flood"] * 12)
    # Headroom alone would let it hold 14; the others' 7 places and their bursts are kept.
    assert 1 <= holders.gate.inside <= 4
    await holders.send_all(list("abcdefg"))
    assert holders.gate.waiting == 12 - holders.inside.count("flood")
    await holders.close()


async def test_a_flood_keeps_its_fair_share_of_places_whatever_the_others_need() -> None:
    # The others are expected to need more than every place: flood still holds 16 / 8.
    busy = {name: rate * 2 for name, rate in BUSY.items()}
    holders = await _after((busy, 60.0, 0.5), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert (holders.gate.inside, holders.gate.waiting) == (2, 10)
    await holders.close()


async def test_a_flood_holds_as_many_places_as_the_busiest_of_the_others_not_more() -> None:
    # Each of the others holds 0.75 places (1.25/s of 0.6 s), 5.25 in all: 17 are kept,
    # and flood may hold one place, not 16 / 8: the places the others leave are not free
    # on an engine whose steps slow as the batch grows.
    rates = {"flood": 20.0, **{name: 1.25 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, 0.6), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert (holders.gate.inside, holders.gate.waiting) == (1, 11)
    await holders.close()


async def test_a_popular_adapter_is_kept_only_from_the_headroom_while_all_fit() -> None:
    # popular needs 4 places and the seven others 3.5: 7.5 of 16, nothing is saturated.
    calm = {"popular": 8.0, **{name: 1.0 for name in "abcdefg"}}
    holders = await _after((calm, 60.0, 0.5), capacity=16)
    await holders.send_all(["popular"] * 16)
    assert (holders.gate.inside, holders.gate.waiting) == (14, 2)
    await holders.close()


async def test_the_others_need_is_sized_by_their_own_holds_not_the_floods() -> None:
    # flood asks for 20 places (10/s of 2 s); the others' 0.1 s requests need about 1.4.
    rates = {"flood": 10.0, **{name: 2.0 for name in "abcdefg"}}
    holds = {"flood": 2.0, **{name: 0.1 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, holds), capacity=16)
    await holders.send_all(["flood"] * 16)
    # Sized by a mean over everyone's holds (mostly flood's), the others would keep 16.
    assert holders.gate.inside == 8
    await holders.close()


async def test_places_are_kept_within_seconds_of_a_floods_start() -> None:
    others = {name: 2.0 for name in "abcdefg"}
    # Four seconds in, flood's 10 s rate says it asks for 5 places, its 2 s rate for 13.
    holders = await _after((others, 60.0, 0.5), ({"flood": 30.0, **others}, 4.0, 0.5), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert 1 <= holders.gate.inside <= 4
    await holders.close()


async def test_a_flood_holds_little_more_than_its_share_while_the_others_are_busy() -> None:
    # The others need 3.5 places (2/s of 0.25 s each); flood asks for 20.
    rates = {"flood": 80.0, **{name: 2.0 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, 0.25), capacity=16)
    await holders.send_all(["flood"] * 12)
    # Two deviations (8 kept) would let flood hold 8, three (10 kept) 6; five keep 13.
    assert holders.gate.inside == 3
    await holders.close()


async def test_a_flood_takes_most_of_the_engine_while_the_others_are_light() -> None:
    # The others need 0.35 places (0.2/s of 0.25 s each): 4 are kept.
    rates = {"flood": 80.0, **{name: 0.2 for name in "abcdefg"}}
    holders = await _after((rates, 60.0, 0.25), capacity=16)
    await holders.send_all(["flood"] * 14)
    assert holders.gate.inside == 12
    await holders.close()


async def test_a_held_flood_stays_held_while_its_requests_run_quicker() -> None:
    # Held back, the flood's requests run in a smaller batch and leave sooner: 15 of
    # the 16 places asked for, below the capacity but not by the margin.
    holders = await _after((BUSY, 60.0, 0.5), (BUSY, 5.0, 0.35), capacity=16)
    await holders.send_all(["flood"] * 12)
    assert 1 <= holders.gate.inside <= 4
    await holders.close()


async def test_a_popular_adapter_gets_all_it_asks_once_all_fit_again_after_a_flood() -> None:
    # popular (10/s) is over its fair rate; with the others it asks for 8.7 of 16
    # places, well below saturation: kept only from the headroom again.
    calm = {"popular": 8.0, **{name: 2.0 for name in "abcdefg"}}
    holders = await _after((BUSY, 60.0, 0.5), (calm, 10.0, 0.3), capacity=16)
    await holders.send_all(["popular"] * 16)
    assert (holders.gate.inside, holders.gate.waiting) == (14, 2)
    await holders.close()


async def test_what_a_held_flood_asks_for_is_judged_by_its_holds_in_a_full_engine() -> None:
    # Alone, flood filled the engine with 0.5 s requests; held back beside the others
    # its requests take 0.25 s: 11 places asked at that, 18.5 at its full-engine hold.
    alone = {"flood": 40.0}
    rates = {"flood": 30.0, **{name: 2.0 for name in "abcdefg"}}
    holders = await _after((alone, 10.0, 0.5), (rates, 60.0, 0.25), capacity=16)
    await holders.send_all(["flood"] * 12)
    # The others' 3.5 places and their bursts (13) are kept.
    assert holders.gate.inside == 3
    await holders.close()


async def test_a_burst_of_the_others_filling_the_engine_does_not_let_a_held_flood_in() -> None:
    # Every step slows with the batch: a request holds its place 0.5 s in a full engine,
    # 0.25 s beside 5 others. Twelve adapters send together every two seconds, and each
    # burst fills the engine for a moment while the flood is held back: the flood's
    # quick requests then leave a full engine, though they spent most of their time in
    # a small batch. Counted as holds in a full engine, they would make the flood seem
    # to ask for fewer places than there are, and it would be let in again.
    def hold(inside: int) -> float:
        return 0.1 + 0.025 * inside

    clock = ManualClock()
    gate = FairGate(16, lambda _: 1.0, 2, clock)
    rates = {"flood": 30.0, **{name: 0.5 for name in "abcdefghijkl"}}
    await _history(gate, clock, {"flood": 40.0}, 10.0, hold)
    await _history(gate, clock, rates, 30.0, hold)
    peaks = await _history(gate, clock, rates, 60.0, hold)
    # The others' 3 places and their bursts (11) are kept.
    assert peaks["flood"] == 5
