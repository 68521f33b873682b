"""The adapter tiers of one replica as GetServerInfo, ListAdapters and the metrics
show them: LoRA slots (`--max-loras`) -> host memory (`--max-cpu-loras`, vLLM's own
LRU) -> the engine's loaded revisions -> the local disk (`--adapter-cache-size`) ->
the store (every adapter this replica routes).

vLLM keeps its host-memory LRU to itself; `list_loras()` asks the engine which
adapters are in it, so that number is as fresh as the last refresh (every scrape
interval, and on every GetServerInfo/ListAdapters).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from loraserve.inference.cache import CacheUsage
from loraserve.inference.engine import Engine

if TYPE_CHECKING:
    from loraserve.inference.adapters.ports import RevisionCache
    from loraserve.inference.adapters.registry import AdapterRegistry

log = logging.getLogger(__name__)

# Waits kept for GetServerInfo's percentiles; the metrics histogram keeps them all.
_RECENT_WAITS = 1024


class Tier(enum.Enum):
    """Where a revision's weights are, nearest first: in a batch now, in the engine's
    host memory, on this replica's disk, or only in the store."""

    SLOT = "slot"
    HOST = "host"
    DISK = "disk"
    STORE = "store"


@dataclass
class TierCounters:
    """What the tiers did since start; `InferenceMetrics` counts into it."""

    # Requests that found their adapter not loaded in the engine and waited for it.
    engine_misses: int = 0
    # Of those, the ones whose load had to download it (not on this disk).
    disk_misses: int = 0
    # Revisions taken out of the engine to free disk space.
    engine_evictions: int = 0
    # Revisions deleted from disk to keep the cache under its bound.
    disk_evictions: int = 0
    # Seconds requests waited for a load on miss, the most recent ones.
    recent_waits: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT_WAITS))


@dataclass(frozen=True)
class TierUsage:
    """The tiers now: occupancy, capacity, and what they did."""

    slots_in_use: int
    slot_capacity: int
    host_adapters: int
    host_capacity: int
    engine_adapters: int
    disk: CacheUsage
    routed_adapters: int
    counters: TierCounters

    def wait_percentile(self, fraction: float) -> float:
        waits = sorted(self.counters.recent_waits)
        if not waits:
            return 0.0
        if len(waits) == 1:
            return waits[0]
        return statistics.quantiles(waits, n=100, method="inclusive")[round(fraction * 100) - 1]


class TierView:
    """Reads every tier's state from the part that owns it."""

    def __init__(
        self,
        registry: AdapterRegistry,
        cache: RevisionCache,
        engine: Engine,
        counters: TierCounters,
        *,
        max_loras: int,
        max_cpu_loras: int,
    ) -> None:
        self._registry = registry
        self._cache = cache
        self._engine = engine
        self._counters = counters
        self._max_loras = max_loras
        self._max_cpu_loras = max_cpu_loras
        self._host: set[int] = set()

    async def host_ids(self) -> set[int]:
        """The lora_int_ids in the engine's host memory, asked of the engine now."""
        self._host = await self._engine.list_loras()
        return self._host

    async def watch_host(self, interval_s: float) -> None:
        """Keeps the host-memory count fresh for scrapes; runs until cancelled."""
        while True:
            try:
                await self.host_ids()
            except Exception as exc:
                log.warning("tiers.host_refresh_failed reason=%s", exc)
            await asyncio.sleep(interval_s)

    def usage(self) -> TierUsage:
        counts = self._registry.counts()
        return TierUsage(
            slots_in_use=counts.in_slots,
            slot_capacity=self._max_loras,
            host_adapters=len(self._host),
            host_capacity=self._max_cpu_loras,
            engine_adapters=counts.loaded,
            disk=self._cache.usage(),
            routed_adapters=counts.routed,
            counters=self._counters,
        )
