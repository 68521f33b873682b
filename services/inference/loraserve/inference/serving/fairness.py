"""Fair admission into the engine: round-robin across adapters once it is saturated,
with places kept from adapters sending above their fair rate.

vLLM schedules first come first served, so a flood of requests on one adapter fills its
waiting queue and every other adapter's request waits behind the whole flood. Here at
most `capacity` sequences are in the engine at once (vLLM's `max_num_seqs`, what it
would run in one batch anyway; a request takes a place per sequence, its n, at most
all of them), and the rest wait in one queue per adapter. Whenever a request leaves
the engine, the next ones in come from the adapters with waiting requests in turn:
deficit round-robin, each adapter's sequences in proportion to its weight (default
equal). The request whose turn it is waits for room for all its sequences, and no
later request passes it meanwhile, so a wide request is never starved by narrow ones.
vLLM's scheduler is untouched underneath: it only ever sees a batch's worth of
sequences.

Round-robin alone is work-conserving: under a flood the engine is always full of the
flooded adapter's requests, and a request of any other adapter waits for one to
finish. So places are kept from adapters asking for more than their fair share,
judged by the rate each has sent sequences at recently (serving.demand, time
constant TAU_S), not by the requests it holds now nor by the rate the gate let it in
at (which the gate itself sets): an adapter is over when its recent rate exceeds
MARGIN x its fair rate (the total recent rate x its weight / the sum of the weights of
the adapters seen within TAU_S). Places kept from over adapters: the last `headroom`,
and, while the engine is saturated, as many as the adapters that are not over are
expected to hold plus BURST_SIGMAS standard deviations of that Poisson count, so that
their requests find a free place at once nearly always, not just on average. The
engine turns saturated when the adapters together ask for more places than there are
(their rates over the last FAST_TAU_S x their mean holds in a full engine, Little's
law), and stays so until they ask for fewer than EASED x the places. Holds in a full
engine, because a flood held back leaves a smaller batch, where each step is quicker
(on a CPU engine) and requests hold their places for less: judged by those, what the
adapters ask for would read below the places as soon as the flood is held, and it
would be let in again. A request's hold counts as one in a full engine when the engine
held `capacity - 1` requests or more on average while it was inside. Over adapters still
always get their share: as many places as the busiest of the others is expected to hold
(by weight), never more than capacity x weight / the sum of the weights seen, and at
least one. A flood is held to the room the others leave, never below that share. Not
capacity / the adapters alone: on an engine whose steps slow as the batch grows, the
places the others leave unused are not free, and a flood holding them takes more than
its share of the engine's tokens, slowing every other request.

The cost: while an adapter is over, the kept places the others do not use stay empty,
for as long as the flood lasts. They never stay idle for good: an over adapter's
waiter goes in as soon as a place it may take frees, and its rate decays back under
the margin within about TAU_S of the flood's end. Being over is checked when a request
arrives or leaves, not on a timer. Headroom 0 keeps nothing (plain round-robin);
headroom is at most `capacity - 1`. A lone adapter's fair rate is the total, so it is
never over and has the whole engine; without a flood no adapter is over (adapters near
their fair rate stay well below MARGIN x it), and an adapter merely more popular than
the rest, while everyone fits, is kept only from the last `headroom` places. Waiters
allowed in go by weighted round-robin.

Turns and rates count sequences, not tokens: adapters whose requests are of similar
length get similar shares of the engine's tokens, whatever their n.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection
from contextlib import asynccontextmanager
from dataclasses import dataclass

from loraserve.common.config.admission import AdmissionOptions
from loraserve.inference.serving.demand import RecentDemand

# Ten seconds: long enough that Poisson noise at a few requests/s per adapter seldom
# looks like 1.5x the fair rate (the estimate's spread is 1 / sqrt(2 x tau x rate), a
# quarter at 0.8 requests/s), short enough that a flood is caught within a few seconds.
TAU_S = 10.0
# Two seconds: whether the adapters together ask for more places than there are is
# judged on rates this quick, so that places are kept within a second or two of a
# flood's start rather than once its 10 s rate has built up. A wrong guess costs little:
# rates of requests sent do not depend on the gate, so one that says "saturated" by
# chance says otherwise again seconds later.
FAST_TAU_S = 2.0
# 1.5x the fair rate: adapters near their share (what weighted round-robin gives them
# under saturation) are seldom held back, a flood of several times the share is.
MARGIN = 1.5
# Places kept for the adapters that are not over: their expected number inside plus five
# standard deviations of it (a Poisson count's is its square root), as square-root
# staffing sizes a pool so that arrivals seldom wait. Three would do for that (at E of
# 4-10 the count passes E + 3 sqrt(E) under 1 % of the time), but every place a flood
# takes slows each step of the others' requests on an engine whose step time grows with
# the batch: with three, benchmark 19's flood held 5 of 16 places, the engine ran 1.9x
# the tokens/s of the no-flood arm and the others' TTFT p99 was 1.32x (up to 3.5x). With
# five a flood holds about its fair share while the others are busy (E of 4.5: 16 kept)
# and most of the engine while they are light (E of 1: 6 kept).
BURST_SIGMAS = 5.0
# Saturated until the adapters ask for fewer than 0.8 x the places: rates over 2 s of a
# few dozen requests/s move by about a tenth, and a flood let in and held again every
# few seconds would be felt by every request in the batch.
EASED = 0.8
# An adapter's mean hold follows about its last 64 requests.
HOLD_SPAN = 64


@dataclass(eq=False)
class _Waiter:
    """A request waiting for its turn: the places it needs, and what admits it."""

    places: int
    admitted: asyncio.Future[None]


class FairGate:
    """At most `capacity` sequences in the engine; waiters admitted by weighted
    round-robin over their adapters; places kept from adapters sending above their fair
    rate recently: the last `headroom`, and what the others are expected to need."""

    def __init__(
        self,
        capacity: int,
        weight: Callable[[str], float],
        headroom: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if headroom < 0:
            raise ValueError(f"headroom must not be negative, got {headroom}")
        self._capacity = capacity
        self._headroom = min(headroom, capacity - 1)
        self._weight = weight
        self._clock = clock
        self._demand = RecentDemand(TAU_S, FAST_TAU_S, HOLD_SPAN, weight, clock)
        self._inside = 0
        # The integral of `inside` over time up to `_area_at`: a request's mean batch is
        # its growth over the request's time inside.
        self._area = 0.0
        self._area_at = clock()
        self._saturated = False
        # Places held inside per adapter (adapters with none are left out).
        self._held: dict[str, int] = {}
        self._waiting: dict[str, deque[_Waiter]] = {}
        # Adapters with waiting requests, in turn order; the first is the one whose turn it is.
        self._ring: deque[str] = deque()
        self._deficit: dict[str, float] = {}

    @property
    def inside(self) -> int:
        """Sequences in the engine now."""
        return self._inside

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return sum(len(q) for q in self._waiting.values())

    @asynccontextmanager
    async def turn(self, adapter: str, sequences: int = 1) -> AsyncIterator[None]:
        """Holds places in the engine for one request of `adapter` of `sequences` (its
        n; at most every place), waiting for them when the engine is saturated (or only
        places kept from it are free while `adapter` is over its fair rate)."""
        places = min(sequences, self._capacity)
        if self._headroom:
            self._demand.arrived(adapter, places)
        # A waiter may have fallen under the margin since the last dispatch: it goes
        # first, so a request let in at once passes no one who could take its place,
        # nor the one whose turn it is, waiting for room.
        due = self._dispatch()
        if not due and self._inside + places <= self._capacity and adapter not in self._barred():
            self._admit(adapter, places)
        else:
            await self._wait(adapter, places)
        admitted_at = self._clock()
        area_then = self._area_now(admitted_at)
        try:
            yield
        finally:
            if self._headroom:
                now = self._clock()
                held = now - admitted_at
                # Full if the engine was full on average while this request was inside,
                # not merely as it left: a burst of the others filling the places for a
                # moment must not pass a held flood's quick holds off as full-engine ones.
                full = held > 0 and (self._area_now(now) - area_then) / held >= self._capacity - 1
                self._demand.left(adapter, held, full)
            self._leave(adapter, places)

    async def _wait(self, adapter: str, places: int) -> None:
        waiter = _Waiter(places, asyncio.get_running_loop().create_future())
        queue = self._waiting.get(adapter)
        if queue is None:
            queue = self._waiting[adapter] = deque()
            self._ring.append(adapter)
            self._deficit[adapter] = 0.0
        queue.append(waiter)
        try:
            await waiter.admitted
        except asyncio.CancelledError:
            if waiter.admitted.done() and not waiter.admitted.cancelled():
                # Admitted just as it was cancelled: give the places to the next ones.
                self._leave(adapter, places)
            else:
                self._forget(adapter, waiter)
            raise

    def _barred(self) -> Collection[str]:
        """The adapters that may not take a free place now: of those over their fair
        rate, the ones holding their share of places already, while the places
        left are kept: the last `headroom`, or, while the adapters together ask for
        more than all of them, what the others are expected to need. O(adapters)."""
        if not self._headroom:
            return ()
        rates = self._demand.rates()
        over = self._demand.over(rates, MARGIN)
        if not over:
            # Saturation is judged afresh at the next flood, not left over from the last.
            self._saturated = False
            return ()
        kept = self._headroom
        busiest: float | None = None
        if self._saturated_now(rates):
            others = {a: r for a, r in rates.items() if a not in over}
            expected = self._demand.places(others)
            kept = max(kept, math.ceil(expected + BURST_SIGMAS * math.sqrt(expected)))
            busiest = max(
                (self._demand.places({a: r}) / self._weight(a) for a, r in others.items()),
                default=0.0,
            )
        held_by_over = sum(self._held.get(a, 0) for a in over)
        if self._inside < self._capacity - self._headroom and held_by_over < self._capacity - kept:
            return ()
        weights = sum(self._weight(a) for a in rates)
        return {a for a in over if self._held.get(a, 0) >= self._share(a, weights, busiest)}

    def _saturated_now(self, rates: dict[str, float]) -> bool:
        """Whether the adapters of `rates` ask for more places than there are, with
        hysteresis: saturated above the capacity, eased below EASED x it."""
        asked = self._demand.places(self._demand.fast_rates(rates), full=True)
        if asked > self._capacity:
            self._saturated = True
        elif asked < EASED * self._capacity:
            self._saturated = False
        return self._saturated

    def _share(self, adapter: str, weights: float, busiest: float | None) -> int:
        """The places `adapter` may always hold, though over its fair rate: its share
        of the places by weight, and, while saturated (`busiest` the most places any of
        the others is expected to hold, per unit of weight), no more than the busiest of
        the others holds, to the nearest place. At least one."""
        share = self._capacity * self._weight(adapter) / weights
        if busiest is not None:
            share = min(share, round(busiest * self._weight(adapter)))
        return max(1, int(share))

    def _area_now(self, now: float) -> float:
        """The integral of `inside` up to `now`, brought up to date."""
        self._area += self._inside * (now - self._area_at)
        self._area_at = now
        return self._area

    def _admit(self, adapter: str, places: int) -> None:
        self._area_now(self._clock())
        self._inside += places
        self._held[adapter] = self._held.get(adapter, 0) + places

    def _leave(self, adapter: str, places: int) -> None:
        self._area_now(self._clock())
        self._inside -= places
        held = self._held[adapter] - places
        if held:
            self._held[adapter] = held
        else:
            del self._held[adapter]
        self._dispatch()

    def _forget(self, adapter: str, waiter: _Waiter) -> None:
        queue = self._waiting.get(adapter)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            self._drop(adapter)

    def _drop(self, adapter: str) -> None:
        del self._waiting[adapter]
        del self._deficit[adapter]
        self._ring.remove(adapter)

    def _dispatch(self) -> bool:
        """Admits waiters while any may go in: of those, the adapter whose turn it is
        takes requests while its deficit covers their places, and gains its weight when
        its turn comes round. True when the request whose turn it is waits for room
        (nobody passes it). O(adapters) per request admitted."""
        while self._ring and self._inside < self._capacity:
            barred = self._barred()
            if all(adapter in barred for adapter in self._ring):
                return False
            self._top_up(barred)
            adapter = self._ring[0]
            while adapter in barred or self._deficit[adapter] < self._waiting[adapter][0].places:
                if adapter not in barred:
                    self._deficit[adapter] += self._weight(adapter)
                self._ring.rotate(-1)
                adapter = self._ring[0]
            queue = self._waiting[adapter]
            waiter = queue[0]
            # A waiter cancelled whose task has yet to run to forget it takes no place.
            if not waiter.admitted.cancelled():
                if self._inside + waiter.places > self._capacity:
                    return True
                self._deficit[adapter] -= waiter.places
                self._admit(adapter, waiter.places)
                waiter.admitted.set_result(None)
            queue.popleft()
            if not queue:
                self._drop(adapter)
        return False

    def _top_up(self, barred: Collection[str]) -> None:
        """Gives the adapters that may go in, at once, all but the last of the rounds
        of weight the first of them needs to cover its next request's places: a wide
        request at a small weight would take many turns of the ring one at a time."""
        may_go = [a for a in self._ring if a not in barred]
        rounds = min(
            math.ceil((self._waiting[a][0].places - self._deficit[a]) / self._weight(a))
            for a in may_go
        )
        if rounds > 1:
            for adapter in may_go:
                self._deficit[adapter] += (rounds - 1) * self._weight(adapter)


def fair_gate(options: AdmissionOptions, max_num_seqs: int) -> FairGate | None:
    """The gate that admits requests into the engine in turn across adapters, at most
    one batch's worth of sequences (or `--max-engine-requests`) at once, keeping places
    (at least `--fair-headroom`) from adapters sending above their fair rate; None for
    fifo."""
    if not options.fair:
        return None
    weights = dict(options.weights)
    capacity = options.max_engine_requests or max_num_seqs
    return FairGate(capacity, lambda a: weights.get(a, 1.0), options.headroom)
