"""LoRA slots taken in turn: at most `slots` adapters in the engine at once, and an
adapter waiting for one has a slot drained for it.

vLLM batches at most `max_loras` adapters at once. Its scheduler skips a waiting request
whose adapter would be one too many and takes the next that fits, so the requests of the
adapters already running keep going in, and another adapter gets a slot only once every
request of one of those has ended. An adapter asked for again before its last request
ends never lets its slot go: on a replica where a few such adapters hold the slots, a
request of any other waits for the rare moment one of them runs dry (vLLM #16876; SGLang
drains adapters for the same reason, sglang #15129). On benchmark 10's fleet (24
adapters, 4 slots a replica) the adapter-affinity arm's coldest adapters waited up to
6 s for a first token this way, round robin's up to 4 s.

So the slots are handed out here, before the engine. A request of an adapter holding a
slot goes in at once; one of an adapter holding none takes a free slot, or waits for one
in the order the adapters asked. For each adapter waiting without a slot, one adapter
holding a slot is drained: its new requests wait, those inside end, and the slot passes
to the adapter whose turn it is. The one drained is the one with the fewest requests
inside (the longest resident among equals): it gives its slot up soonest and is the
least asked for, so a hot adapter keeps its slot and the cold ones take turns in the
rest. A drained adapter's waiting requests then wait for a slot like any other's. No
adapter waits for more than one drain per adapter ahead of it, and the engine never
sees more adapters than its slots. On that fleet the affinity arm's TTFT p99 came to
0.93 x round robin's, from 1.10 x (bench/results/2026-12-07T1751Z against 1553Z), at
the cost of its median (124 to 287 ms) and of round robin's tokens/s (569 to 456: each
drain thins a batch vLLM's order keeps full), which is why it is not the default
(`--lora-slot-order turns`).

The base model's requests need no slot. Adapters are known here by name, not revision:
while a rollout splits one adapter over two revisions, or a request pins an older one,
it takes two of vLLM's slots and one here, and vLLM's own skipping handles the one too
many. The costs: each request of an adapter without a slot drains one, so a caller
asking for many cold adapters (or asking and cancelling) delays the requests of the
adapter drained, by up to its longest request inside, as a flood delays the others'
(the fair gate, outside this one, bounds how many places a flood holds); and a request
waiting here holds its place in the fair gate meanwhile.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

__all__ = ["SlotGate"]


class SlotGate:
    """At most `slots` adapters inside at once; adapters waiting for a slot are given
    one in the order they asked, each by draining the adapter with the fewest requests
    inside."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self._slots = slots
        # Requests inside per adapter holding a slot, in the order they took it.
        self._inside: dict[str, int] = {}
        # Adapters asked to give their slot up: none of their requests go in meanwhile.
        self._draining: set[str] = set()
        # Requests waiting per adapter, and the adapters waiting for a slot in turn.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self._turns: deque[str] = deque()

    @property
    def waiting(self) -> int:
        """Requests waiting for their adapter's slot."""
        return sum(len(q) for q in self._waiting.values())

    @property
    def resident(self) -> tuple[str, ...]:
        """The adapters holding a slot, in the order they took it."""
        return tuple(self._inside)

    @asynccontextmanager
    async def turn(self, adapter: str) -> AsyncIterator[None]:
        """Holds `adapter`'s slot (none for the base model, "") while a request of it
        is inside, waiting for the slot first where another adapter holds it."""
        if not adapter:
            yield
            return
        if self._may_enter(adapter):
            self._enter(adapter)
        else:
            await self._wait(adapter)
        try:
            yield
        finally:
            self._leave(adapter)

    def _may_enter(self, adapter: str) -> bool:
        if adapter in self._inside:
            return adapter not in self._draining
        return self._wanted() < 0

    def _enter(self, adapter: str) -> None:
        self._inside[adapter] = self._inside.get(adapter, 0) + 1

    async def _wait(self, adapter: str) -> None:
        waiter = asyncio.get_running_loop().create_future()
        queue = self._waiting.get(adapter)
        if queue is None:
            queue = self._waiting[adapter] = deque()
            self._turns.append(adapter)
        queue.append(waiter)
        self._drain()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Let in just as it was cancelled: it leaves as any request does.
                self._leave(adapter)
            else:
                self._forget(adapter, waiter)
            raise

    def _forget(self, adapter: str, waiter: asyncio.Future[None]) -> None:
        queue = self._waiting.get(adapter)
        # Cancelled as its adapter was given a slot: the queue it was in is gone.
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[adapter]
            self._turns.remove(adapter)
            # A slot asked for and no longer needed: the drained adapter keeps it.
            self._undrain()

    def _leave(self, adapter: str) -> None:
        left = self._inside[adapter] - 1
        if left:
            self._inside[adapter] = left
            return
        del self._inside[adapter]
        if adapter in self._draining:
            self._draining.discard(adapter)
            if adapter in self._waiting:
                # Asked again while drained: behind the adapters it was drained for, or
                # its own slot would come straight back to it and theirs need another.
                self._turns.remove(adapter)
                self._turns.append(adapter)
        self._dispatch()

    def _dispatch(self) -> None:
        """Gives free slots to the adapters waiting without one, in turn, letting all
        their waiting requests in, then drains for those still waiting."""
        while len(self._inside) < self._slots:
            adapter = next((a for a in self._turns if a not in self._inside), None)
            if adapter is None:
                break
            self._readmit(adapter)
        # An adapter given a slot another left may no longer need the one drained for it.
        self._undrain()
        self._drain()

    def _wanted(self) -> int:
        """Slots wanted beyond the free ones: by the adapters waiting that hold none (a
        drained adapter waits on its own slot until it is gone)."""
        homeless = sum(1 for adapter in self._turns if adapter not in self._inside)
        return homeless - (self._slots - len(self._inside))

    def _drain(self) -> None:
        """Drains as many slots as are wanted (`_victims` order); a drained adapter's
        slot goes as soon as its last request inside ends."""
        wanted = self._wanted()
        for adapter in self._victims():
            if len(self._draining) >= wanted:
                return
            self._draining.add(adapter)

    def _victims(self) -> list[str]:
        """The adapters holding slots in the order they are drained: fewest requests
        inside first (the quickest to give their slot up, and the least asked for),
        the longest resident first among equals."""
        return sorted(self._inside, key=self._inside.__getitem__)

    def _undrain(self) -> None:
        """Lets drained adapters keep their slots where fewer are wanted now (those
        with the most requests inside first), their waiting requests back in."""
        wanted = max(0, self._wanted())
        for adapter in reversed(self._victims()):
            if len(self._draining) <= wanted:
                return
            if adapter in self._draining:
                self._draining.discard(adapter)
                self._readmit(adapter)

    def _readmit(self, adapter: str) -> None:
        queue = self._waiting.pop(adapter, None)
        if queue is None:
            return
        self._turns.remove(adapter)
        for waiter in queue:
            if not waiter.done():
                self._enter(adapter)
                waiter.set_result(None)
