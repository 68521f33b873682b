"""What the synchronizer is given: the store's calls, the disk cache's sweep, and
its settings (each a Protocol or plain data, so tests hand it fakes)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from loraserve.clients.store import Heartbeat, Listing, StoreEvent
from loraserve.inference.sync.reports import ReportSettings, StatusAPI


class StoreAPI(StatusAPI, Protocol):
    """The calls the synchronizer makes to the store (`StoreClient`, or a fake)."""

    async def list_adapters(self, base_model: str = "") -> Listing: ...

    def watch(
        self, after_seq: int, incarnation: str = ""
    ) -> AsyncGenerator[StoreEvent | Heartbeat, None]: ...


class DiskCache(Protocol):
    """What sync needs of the disk cache (`AdapterCache`): its start-up sweep, and
    which adapters this replica served most recently."""

    async def sweep(self, keep: Callable[[str, int], bool]) -> None:
        """Removes every revision on disk that `keep` rejects."""
        ...

    def recent_names(self) -> list[str]:
        """Adapters with a revision on disk, the most recently used first."""
        ...


@dataclass(frozen=True)
class SyncSettings:
    # Waits between retries: the first, and the most (stamina's wait_initial, wait_max).
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    # Downloads and loads at once, so a start-up with many adapters stays bounded.
    max_concurrent_loads: int = 4
    # Adapters loaded before SERVING, and loaded on publish while fewer are resident.
    prefetch_adapters: int = 32
    # How often what this replica routes is reported to the store (reports.py).
    reports: ReportSettings = field(default_factory=ReportSettings)
    # This replica's id, named on its sync spans (a trace holds every replica's).
    replica_id: str = ""
