"""Fair admission into the engine: round-robin across adapters once it is saturated,
with headroom kept for adapters below their fair share.

vLLM schedules first come first served, so a flood of requests on one adapter fills its
waiting queue and every other adapter's request waits behind the whole flood. Here at
most `capacity` requests are in the engine at once (vLLM's `max_num_seqs`, what it
would run in one batch anyway), and the rest wait in one queue per adapter. Whenever a
request leaves the engine, the next one in comes from the adapters with waiting
requests in turn: deficit round-robin, each adapter's turns in proportion to its
weight (default equal). vLLM's scheduler is untouched underneath: it only ever sees a
batch's worth of requests.

Round-robin alone is work-conserving: under a flood the engine is always full of the
flooded adapter's requests, and a request of any other adapter waits for one to
finish. So the last `headroom` slots are kept for adapters below their fair share: an
adapter's share is `capacity` x its weight / the sum of the weights of the adapters
with requests inside or waiting, and never more than `capacity - headroom`. An adapter
holding at least its share goes in only while fewer than `capacity - headroom`
requests are inside; one holding less goes in while any slot is free, so it finds one
at once unless more than `headroom` such requests arrived since the last one left.
Waiters allowed in go by weighted round-robin, as without headroom.

The cost: while every adapter with demand holds at least its share (one adapter alone,
or all of them saturating), `headroom` slots stay empty, so the engine runs
`capacity - headroom` requests instead of `capacity` (at most headroom / capacity of
its tokens/s, less where a smaller batch runs each step faster). Those slots are never
idle forever: the requests inside finish, and whoever waits goes in then. Headroom
0 is plain round-robin, and it is at most `capacity - 1`, so any adapter can always
have a request inside.

Turns and shares count requests, not tokens: adapters whose requests are of similar
length get similar shares of the engine's tokens.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class FairGate:
    """At most `capacity` requests in the engine; waiters admitted by weighted
    round-robin over their adapters; the last `headroom` slots only for adapters
    below their fair share."""

    def __init__(self, capacity: int, weight: Callable[[str], float], headroom: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if headroom < 0:
            raise ValueError(f"headroom must not be negative, got {headroom}")
        self._capacity = capacity
        self._headroom = min(headroom, capacity - 1)
        self._weight = weight
        self._inside = 0
        # Adapters with requests inside or waiting: their weight and requests inside.
        self._active: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._total_weight = 0.0
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        # Adapters with waiting requests, in turn order; the first is the one whose turn it is.
        self._ring: deque[str] = deque()
        self._deficit: dict[str, float] = {}

    @property
    def inside(self) -> int:
        """Requests in the engine now."""
        return self._inside

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return sum(len(q) for q in self._waiting.values())

    @asynccontextmanager
    async def turn(self, adapter: str) -> AsyncIterator[None]:
        """Holds a place in the engine for one request of `adapter`, waiting for it
        when the engine is saturated (or only headroom is left and `adapter` holds its
        share)."""
        self._activate(adapter)
        # Every waiter still waiting may not go in now (each dispatch admits all that
        # may), so a request allowed in passes no one who could take its place.
        if self._allowed(adapter):
            self._admit(adapter)
        else:
            await self._wait(adapter)
        try:
            yield
        finally:
            self._leave(adapter)

    async def _wait(self, adapter: str) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(adapter)
        if queue is None:
            queue = self._waiting[adapter] = deque()
            self._ring.append(adapter)
            self._deficit[adapter] = 0.0
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Admitted just as it was cancelled: give the place to the next one.
                self._leave(adapter)
            else:
                self._forget(adapter, waiter)
            raise

    def _activate(self, adapter: str) -> None:
        if adapter not in self._active:
            self._active[adapter] = self._weight(adapter)
            self._held[adapter] = 0
            self._total_weight = sum(self._active.values())

    def _deactivate_if_idle(self, adapter: str) -> None:
        """An adapter with nothing inside or waiting leaves the shares, which grow."""
        if self._held.get(adapter) == 0 and adapter not in self._waiting:
            del self._active[adapter]
            del self._held[adapter]
            # Summed afresh, not decremented, so equal shares stay exactly equal.
            self._total_weight = sum(self._active.values())

    def _allowed(self, adapter: str) -> bool:
        """Whether a request of `adapter` may go in now: any free slot if the adapter
        holds less than its share, else only one below the headroom."""
        if self._inside < self._capacity - self._headroom:
            return True
        if self._inside >= self._capacity:
            return False
        held = self._held[adapter]
        below_share = held * self._total_weight < self._capacity * self._active[adapter]
        return below_share and held < self._capacity - self._headroom

    def _admit(self, adapter: str) -> None:
        self._inside += 1
        self._held[adapter] += 1

    def _leave(self, adapter: str) -> None:
        self._inside -= 1
        self._held[adapter] -= 1
        self._deactivate_if_idle(adapter)
        self._dispatch()

    def _forget(self, adapter: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(adapter)
        if queue is None:
            return
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if not queue:
            self._drop(adapter)
            # Its leaving the shares lets no one in: an adapter with nothing inside
            # waits only while the engine is full.
            self._deactivate_if_idle(adapter)

    def _drop(self, adapter: str) -> None:
        del self._waiting[adapter]
        del self._deficit[adapter]
        self._ring.remove(adapter)

    def _dispatch(self) -> None:
        """Admits waiters while any may go in: of those, the adapter whose turn it is
        takes one request per unit of deficit, and gains its weight when its turn comes
        round."""
        while self._ring and self._inside < self._capacity:
            allowed = {adapter for adapter in self._ring if self._allowed(adapter)}
            if not allowed:
                return
            adapter = self._ring[0]
            while adapter not in allowed or self._deficit[adapter] < 1.0:
                if adapter in allowed:
                    self._deficit[adapter] += self._active[adapter]
                self._ring.rotate(-1)
                adapter = self._ring[0]
            queue = self._waiting[adapter]
            waiter = queue.popleft()
            self._deficit[adapter] -= 1.0
            if not queue:
                self._drop(adapter)
            self._admit(adapter)
            waiter.set_result(None)
