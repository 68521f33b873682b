"""The disk bound: bytes on disk plus the downloads in progress never exceed
`--adapter-cache-size`.

A download reserves its bytes before its first byte lands. Room is made by evicting
the least recently used revisions that their holder (the registry) lets go of. A
download that fits the bound on its own but finds every byte held (by running
requests, pins, loads, or other downloads' reservations) waits for room, first come
first served, up to `wait_s`; then it is RESOURCE_EXHAUSTED with a message that says
what holds the bytes. Waiters look again whenever bytes may have freed: a download
ended, files were deleted, or a holder let go of a revision (`changed`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from loraserve.common.errors import FailedPrecondition, ResourceExhausted
from loraserve.common.revisions.manifest import RevisionKey
from loraserve.inference.cache.index import CacheIndex

Evict = Callable[[RevisionKey], Awaitable[bool]]
"""Evicts one revision; False when its holder keeps it (then it stays)."""


class ByteBound:
    """Reservations and evictions under one byte bound (None: unbounded)."""

    def __init__(self, index: CacheIndex, max_bytes: int | None, wait_s: float) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self._index = index
        self.max_bytes = max_bytes
        self._wait_s = wait_s
        # Bytes of downloads in progress, counted against the bound before they land.
        self.reserved = 0
        self._downloads = 0
        self._queue: deque[object] = deque()
        self._changed = asyncio.Event()

    @property
    def waiting(self) -> int:
        """Downloads waiting for room, in turn."""
        return len(self._queue)

    def changed(self) -> None:
        """Bytes may have freed: waiting downloads look again."""
        if self._queue:
            self._changed.set()
            self._changed = asyncio.Event()

    async def reserve(self, key: RevisionKey, size: int, evict: Evict) -> None:
        """Reserves `size` bytes for `key`'s download, evicting what `evict` may and
        waiting for room in turn; FailedPrecondition if it could never fit."""
        bound = self.max_bytes
        if bound is not None and size > bound:
            raise FailedPrecondition(
                f"adapter {key} is {size} bytes, more than the adapter cache holds "
                f"({bound} bytes, --adapter-cache-size)"
            )
        turn = object()
        self._queue.append(turn)
        try:
            async with asyncio.timeout(self._wait_s):
                while True:
                    # Taken before looking, so a change during the look is not missed.
                    changed = self._changed
                    if self._queue[0] is turn and await self._fits(size, evict):
                        break
                    await changed.wait()
        except TimeoutError:
            raise ResourceExhausted(self._full_message(key, size)) from None
        finally:
            self._queue.remove(turn)
            self.changed()
        self.reserved += size
        self._downloads += 1

    def release(self, size: int) -> None:
        """A download ended: its bytes are on disk (indexed) or gone."""
        self.reserved -= size
        self._downloads -= 1
        self.changed()

    async def trim(self, evict: Evict) -> bool:
        """Evicts least recently used revisions until disk and reservations fit the
        bound; False if what is left is all kept."""
        return await self._fits(0, evict)

    async def _fits(self, size: int, evict: Evict) -> bool:
        bound = self.max_bytes
        if bound is None:
            return True
        for victim in self._index.lru():
            if self._index.disk_bytes + self.reserved + size <= bound:
                return True
            await evict(victim)
        return self._index.disk_bytes + self.reserved + size <= bound

    def _full_message(self, key: RevisionKey, size: int) -> str:
        return (
            f"adapter cache full: {key} needs {size} bytes and waited {self._wait_s:g} s "
            f"for room; of the {self.max_bytes} bytes (--adapter-cache-size), "
            f"{self._index.disk_bytes} are on disk ({len(self._index)} revisions, held by "
            f"running requests, pins or loads, and the index) and {self.reserved} are "
            f"reserved by {self._downloads} downloads in progress"
        )
