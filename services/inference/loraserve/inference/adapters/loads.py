"""Getting one revision into the engine, exactly once however many callers ask.

A load runs in its own task: callers wait on it shielded, so one that gives up
(a request's deadline or cancel) leaves it to the others, and the load claims its
result (route it, pin it) as its first caller asked even if that caller is gone.
A load that fails, or whose name is deleted meanwhile, leaves nothing in the engine
and no files. `AdapterRegistry` owns the entries and decides routes; this module
only moves an entry from absent (or FAILED) through LOADING to READY.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from loraserve.common.errors import NotFound
from loraserve.common.manifest import Revision
from loraserve.inference.adapters.compat import manifest_facts
from loraserve.inference.adapters.in_engine import EngineAdapters
from loraserve.inference.adapters.state import Key, Phase, RevisionEntry
from loraserve.inference.cache import CachedRevision
from loraserve.inference.engine import AdapterHandle

log = logging.getLogger(__name__)


class RevisionCache(Protocol):
    """Owns the revisions' directories (`AdapterCache`, or a fake in tests)."""

    async def fetch(
        self, name: str, revision: int, manifest: Revision | None = None
    ) -> CachedRevision:
        """A verified local copy; looks the manifest up when none is given. Raises
        NotFound, FailedPrecondition, DataLoss or Unavailable."""
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

    def is_cached(self, name: str, revision: int) -> bool: ...


class RevisionLoads:
    """Loads revisions into the registry's `entries`; see the module docstring."""

    def __init__(
        self,
        entries: dict[Key, RevisionEntry],
        adapters: EngineAdapters,
        cache: RevisionCache | None,
        update: Callable[[RevisionEntry], None],
        spawn: Callable[[Awaitable[None]], asyncio.Task[None]],
    ) -> None:
        self._entries = entries
        self._adapters = adapters
        self._cache = cache
        self._update = update
        self._spawn = spawn

    async def obtain(self, key: Key, given: CachedRevision | None) -> CachedRevision:
        # A revision's files go back to the cache when it leaves the engine; one asked
        # for again after that (a rollback, a pin) is fetched again.
        if given is not None and given.path.is_dir():
            return given
        if self._cache is None:
            raise NotFound(f"adapter {key[0]}@{key[1]} is not loaded here")
        return await self._cache.fetch(*key, given.manifest if given is not None else None)

    async def fetch(self, target: Revision) -> CachedRevision:
        if self._cache is None:
            raise NotFound(f"adapter {target.adapter_name}@{target.revision} is not loaded here")
        return await self._cache.fetch(target.adapter_name, target.revision, target)

    async def ensure_loaded(
        self,
        key: Key,
        obtain: Callable[[], Awaitable[CachedRevision]],
        claim: Callable[[RevisionEntry], None],
    ) -> RevisionEntry | None:
        """The revision READY or DRAINING in the engine, claimed by `claim` (route it,
        pin it) in the same step, so it is never seen unclaimed and retired. None when
        this caller's own load landed but `claim` did not keep it (its name moved on
        to a newer target meanwhile)."""
        while True:
            entry = self._entries.get(key)
            if entry is not None and entry.phase in (Phase.READY, Phase.DRAINING):
                claim(entry)
                return entry
            if entry is not None and entry.phase is Phase.REMOVING:
                await entry.done.wait()
                continue
            own = entry is None or entry.phase is Phase.FAILED
            if own:
                loading = RevisionEntry(*key, Phase.LOADING)
                self._entries[key] = loading
                loading.task = self._spawn(self._load(loading, obtain, entry, claim))
                entry = loading
            assert entry is not None
            assert entry.task is not None
            # Shielded: a caller that gives up leaves the load to the others.
            await asyncio.shield(entry.task)
            if own:
                kept = self._entries.get(key) is entry and entry.phase is Phase.READY
                return entry if kept else None

    async def _load(
        self,
        entry: RevisionEntry,
        obtain: Callable[[], Awaitable[CachedRevision]],
        failed: RevisionEntry | None,
        claim: Callable[[RevisionEntry], None],
    ) -> None:
        """Loads a revision that is absent or FAILED, and claims it as its first
        caller asked, even if that caller is gone by then."""
        key = entry.key
        cached: CachedRevision | None = None
        added: AdapterHandle | None = None
        try:
            cached = await obtain()
            entry.manifest, entry.path = cached.manifest, cached.path
            entry.downloaded = cached.downloaded
            self._check_not_deleted(entry)
            await self._adapters.check(manifest_facts(cached.manifest), cached.path)
            handle = self._adapters.handle(*key, cached.path)
            await self._adapters.add(handle)
            added = handle
            self._check_not_deleted(entry)
            entry.handle, entry.phase = handle, Phase.READY
            log.info("adapter.loaded name=%s rev=%d lora_int_id=%d", *key, handle.lora_int_id)
            claim(entry)
            self._update(entry)
        except Exception:
            await self._adapters.discard(added)
            if cached is not None:
                await self.release_files(key)
            raise
        finally:
            if entry.phase is Phase.LOADING and self._entries.get(key) is entry:
                # Did not load: what was known before (a failure) comes back, unless
                # the name was deleted meanwhile.
                if failed is None or entry.discarded:
                    del self._entries[key]
                else:
                    self._entries[key] = failed
            entry.done.set()

    def _check_not_deleted(self, entry: RevisionEntry) -> None:
        if entry.discarded:
            log.info("adapter.load_discarded name=%s rev=%d: deleted while loading", *entry.key)
            raise NotFound(f"adapter {entry.name}@{entry.revision} was deleted")

    async def release_files(self, key: Key) -> None:
        """Hands a revision's files back to the cache, which deletes them."""
        if self._cache is not None:
            await self._cache.remove(*key)
