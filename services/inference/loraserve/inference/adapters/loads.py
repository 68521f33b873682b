"""Getting one revision into the engine, exactly once however many callers ask.

Invariants: a load runs in its own task that callers wait on shielded, so one that
gives up (a request's deadline or cancel) leaves it to the others; the load claims its
result (route it, pin it) as its first caller asked, even if that caller is gone; a
load that fails, or whose name is deleted meanwhile, leaves nothing in the engine and
no files. The registry owns the entries and decides routes; this module only moves an
entry from absent (or FAILED) through LOADING to READY.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from opentelemetry.trace import Span

from loraserve.common.errors import NotFound
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.common.tracing import child_span, tracer
from loraserve.inference.adapters.compat import manifest_facts
from loraserve.inference.adapters.in_engine import EngineAdapters
from loraserve.inference.adapters.ports import RevisionCache
from loraserve.inference.adapters.state import RevisionEntry, RevisionLife
from loraserve.inference.adapters.tiers import Tier
from loraserve.inference.cache import CachedRevision, Holder
from loraserve.inference.engine import AdapterHandle

log = logging.getLogger(__name__)
_TRACER = tracer(__name__)

Claim = Callable[[RevisionEntry], None]
"""What a load does with its revision once it is in the engine: route it, or pin it."""


class RevisionLoads:
    """Loads revisions into the registry's `entries`; see the module docstring."""

    def __init__(
        self,
        entries: dict[RevisionKey, RevisionEntry],
        adapters: EngineAdapters,
        cache: RevisionCache,
        holder: Holder,
        update: Callable[[RevisionEntry], None],
        spawn: Callable[[Awaitable[None]], asyncio.Task[None]],
    ) -> None:
        self._entries = entries
        self._adapters = adapters
        self._cache = cache
        self._holder = holder
        self._update = update
        self._spawn = spawn

    async def ensure_loaded(
        self, key: RevisionKey, manifest: Revision | None, claim: Claim
    ) -> RevisionEntry | None:
        """The revision READY or DRAINING in the engine, claimed by `claim` in the same
        step, so it is never seen unclaimed and retired. `manifest` is what the store
        said of it (None: the cache asks the store). None when this caller's own load
        landed but `claim` did not keep it (its name moved on to a newer target)."""
        while True:
            entry = self._entries.get(key)
            if entry is not None and entry.state in (RevisionLife.READY, RevisionLife.DRAINING):
                claim(entry)
                return entry
            if entry is not None and entry.state is RevisionLife.REMOVING:
                await entry.done.wait()
                continue
            own = entry is None or entry.state is RevisionLife.FAILED
            if own:
                loading = RevisionEntry(key, RevisionLife.LOADING)
                self._entries[key] = loading
                loading.task = self._spawn(self._load(loading, manifest, entry, claim))
                entry = loading
            assert entry is not None
            assert entry.task is not None
            await self._wait_for(entry, entry.task)
            if own:
                kept = self._entries.get(key) is entry and entry.state is RevisionLife.READY
                return entry if kept else None

    async def _wait_for(self, entry: RevisionEntry, load: asyncio.Task[None]) -> None:
        """Waits for a load, counted as a waiter until this caller is back: the landed
        revision is not evicted before its callers run on it. Shielded: a caller that
        gives up leaves the load to the others."""
        entry.waiters += 1
        try:
            await asyncio.shield(load)
        finally:
            entry.waiters -= 1
            if not entry.waiters:
                self._cache.hold_ended()

    async def _load(
        self,
        entry: RevisionEntry,
        manifest: Revision | None,
        failed: RevisionEntry | None,
        claim: Claim,
    ) -> None:
        """Loads a revision that is absent or FAILED, and claims it as its first
        caller asked, even if that caller is gone by then."""
        key = entry.key
        # What waiters of this load wait on. A claim that finds the revision unwanted
        # (a rollout ended while its candidate loaded) starts its removal, which gives
        # the entry a new `done` for the removal: setting that one here would tell
        # `ensure_loaded` the removal is over, and it would spin without yielding.
        loaded = entry.done
        cached: CachedRevision | None = None
        added: AdapterHandle | None = None
        try:
            with child_span(_TRACER, "loraserve.replica.install") as span:
                describe_install(span, entry)
                cached = await self._cache.fetch(*key, manifest, holder=self._holder)
                entry.manifest, entry.path = cached.manifest, cached.path
                entry.downloaded = cached.downloaded
                self._check_not_deleted(entry)
                await self._adapters.check(manifest_facts(cached.manifest), cached.path)
                handle = self._adapters.handle(*key, cached.path)
                describe_install(span, entry, handle)
                await self._adapters.add(handle)
                added = handle
                self._check_not_deleted(entry)
                entry.handle, entry.state = handle, RevisionLife.READY
                log.info("adapter.loaded name=%s rev=%d lora_int_id=%d", *key, handle.lora_int_id)
                claim(entry)
                self._update(entry)
        except Exception:
            await self._adapters.discard(added)
            if cached is not None:
                await self.release_files(key)
            raise
        finally:
            if entry.state is RevisionLife.LOADING and self._entries.get(key) is entry:
                # Did not load: what was known before (a failure) comes back, unless
                # the name was deleted meanwhile.
                if failed is None or entry.discarded:
                    del self._entries[key]
                else:
                    self._entries[key] = failed
            loaded.set()
            self._cache.hold_ended()

    def _check_not_deleted(self, entry: RevisionEntry) -> None:
        if entry.discarded:
            log.info("adapter.load_discarded name=%s rev=%d: deleted while loading", *entry.key)
            raise NotFound(f"adapter {entry.key} was deleted")

    async def release_files(self, key: RevisionKey) -> None:
        """Hands a revision's files back to the cache, which deletes them."""
        await self._cache.remove(*key)


def describe_install(span: Span, entry: RevisionEntry, handle: AdapterHandle | None = None) -> None:
    """Names the revision an install span loads; once its files are here (`handle`), the
    tier they came from: the store (downloaded now) or this replica's disk."""
    if not span.is_recording():
        return
    if handle is None:
        span.set_attributes({"loraserve.adapter": entry.name, "loraserve.revision": entry.revision})
        return
    tier = Tier.STORE if entry.downloaded else Tier.DISK
    span.set_attributes({"loraserve.tier": tier.value, "loraserve.lora_int_id": handle.lora_int_id})
