"""What the adapters package needs of its neighbours, as one Protocol each: the disk
cache that owns the revisions' files, and who counts what the tiers do."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from loraserve.common.revisions.manifest import Revision
from loraserve.inference.cache import CachedRevision, CacheUsage, Holder


class RevisionCache(Protocol):
    """The disk tier (`AdapterCache`, or a fake in tests)."""

    @property
    def root(self) -> Path:
        """The only directory the engine may load adapters from."""
        ...

    async def fetch(
        self,
        name: str,
        revision: int,
        manifest: Revision | None = None,
        *,
        holder: Holder | None = None,
    ) -> CachedRevision:
        """A verified local copy; looks the manifest up when none is given; asks
        `holder` to let go of revisions to make room. Raises NotFound,
        FailedPrecondition, DataLoss, ResourceExhausted or Unavailable."""
        ...

    async def remove(self, name: str, revision: int) -> None:
        """Deletes the revision's files: the engine no longer reads them."""
        ...

    async def remove_unused(self, name: str, in_use: Callable[[str, int], bool]) -> None:
        """Deletes the adapter's revisions on disk that `in_use` rejects."""
        ...

    def touch(self, name: str, revision: int) -> None:
        """The revision served a request (the disk tier's LRU order)."""
        ...

    def hold_ended(self) -> None:
        """A revision stopped being held: downloads waiting for room look again."""
        ...

    def is_cached(self, name: str, revision: int) -> bool: ...

    def usage(self) -> CacheUsage: ...


class RegistryObserver(Protocol):
    """Counts what the engine tier does (`InferenceMetrics`)."""

    def adapter_load_failed(self, name: str) -> None: ...

    def adapter_missed(self, tier: str) -> None: ...

    def adapter_load_waited(self, source: str, seconds: float) -> None: ...

    def adapter_evicted(self, tier: str) -> None: ...

    def rollout_set(self, name: str, candidate: int) -> None:
        """The name's requests are split with `candidate` (its counts per revision
        are kept while the rollout lasts)."""

    def rollout_ended(self, name: str) -> None: ...
