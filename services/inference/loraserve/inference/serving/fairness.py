"""Fair admission into the engine: round-robin across adapters once it is saturated.

vLLM schedules first come first served, so a flood of requests on one adapter fills its
waiting queue and every other adapter's request waits behind the whole flood. Here at
most `capacity` requests are in the engine at once (vLLM's `max_num_seqs`, what it
would run in one batch anyway), and the rest wait in one queue per adapter. Whenever a
request leaves the engine, the next one in comes from the adapters with waiting
requests in turn: deficit round-robin, each adapter's turns in proportion to its
weight (default equal). Below saturation nothing waits. vLLM's scheduler is untouched
underneath: it only ever sees a batch's worth of requests.

Turns count requests, not tokens: adapters whose requests are of similar length get
similar shares of the engine's tokens.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class FairGate:
    """At most `capacity` requests in the engine; waiters admitted by weighted
    round-robin over their adapters."""

    def __init__(self, capacity: int, weight: Callable[[str], float]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._weight = weight
        self._inside = 0
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
        when the engine is saturated."""
        if self._inside < self._capacity and not self._ring:
            self._inside += 1
        else:
            await self._wait(adapter)
        try:
            yield
        finally:
            self._inside -= 1
            self._dispatch()

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
                self._inside -= 1
                self._dispatch()
            else:
                self._forget(adapter, waiter)
            raise

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

    def _drop(self, adapter: str) -> None:
        del self._waiting[adapter]
        del self._deficit[adapter]
        self._ring.remove(adapter)

    def _dispatch(self) -> None:
        """Admits waiters while there is room: the adapter whose turn it is takes one
        request per unit of deficit, and gains its weight when its turn comes round."""
        while self._inside < self._capacity and self._ring:
            adapter = self._ring[0]
            if self._deficit[adapter] < 1.0:
                self._deficit[adapter] += self._weight(adapter)
                self._ring.rotate(-1)
                continue
            queue = self._waiting[adapter]
            waiter = queue.popleft()
            self._deficit[adapter] -= 1.0
            if not queue:
                self._drop(adapter)
            self._inside += 1
            waiter.set_result(None)
