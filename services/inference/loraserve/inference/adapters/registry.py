"""Which adapter revisions are loaded in the engine, and where each adapter name routes.

Hot-swap is make-before-break. Every (name, revision) is its own engine adapter, named
`"<name>@<revision>"` with a `lora_int_id` never used before on the engine, and never
loaded in place. A new revision is loaded beside the old one; only after the engine
accepted it does the name's route flip, in one synchronous step. The old revision
then drains: requests already on it finish there, and once it has none in flight and
is neither current nor pinned it is removed from the engine and its files handed back
to the cache (vLLM may re-read an adapter's path until it is removed). Getting one
revision into the engine and out again is `engine_adapters`; the files are the
cache's alone (`AdapterCache.fetch`/`remove`); this module keeps the states and routes.

Residency is lazy. Each name has a target, the manifest of the revision the store
makes current (`set_target` records it without loading anything; `install` loads it
too). A request for a name with no loaded revision loads its target on the spot
(load on miss): from the cache's disk, or downloaded from the store. Every load runs
in its own task that the requests wait on, so concurrent first requests share one
load, and a request that gives up (deadline, cancel) does not abort it for the
others. A load routes the name only if its revision is still the target when it
lands; a request that finds a newer target (pushed meanwhile) loads that one. The
cache evicts a revision only after `release` took it out of the engine, which it
refuses while the revision runs requests, is pinned or is loading.

`name@revision` requests pin that revision: it is fetched through the cache (which
then asks the store for its manifest) and loaded on demand, and kept in a bounded
LRU of pinned revisions.

A delete wins over every load of that name still in flight: the load's result is
discarded (never routed or pinned, its files removed) and its callers get NOT_FOUND,
so a revision the store no longer has cannot become servable after the delete. A
load that fails for any reason leaves no files behind either.

One `RevisionEntry` per revision holds its whole state, moved through explicit
phases (`revisionstate`); names route to READY revisions only.

The seam with the sync side (inference-sync):

    set_target(manifest)                route a name lazily: loaded on its first request
    install(cached, make_current=...)   load a fetched revision; route it or pin it
    record_failure(manifest, message)   a revision that could not even be fetched
    set_current(name, revision)         rollback/promote (fetches if no longer loaded)
    delete(name)                        unroute; every revision drains, then goes;
                                        loads in flight are discarded
    current_revision(name), is_installed(name, revision), holds(...), is_resident(name),
    resident_count(), snapshot()
    release(name, revision)             the cache's eviction: out of the engine if idle
    settle()                            waits for loads and removals in progress

Both sides never load a path that is not inside the adapter cache directory.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loraserve.common.errors import LoraserveError, NotFound, Unavailable
from loraserve.common.manifest import Revision
from loraserve.common.names import AdapterRef
from loraserve.inference.adapters.compat import CompatibilityChecker, manifest_facts
from loraserve.inference.adapters.in_engine import EngineAdapters
from loraserve.inference.adapters.loads import RevisionCache, RevisionLoads
from loraserve.inference.adapters.state import (
    IN_ENGINE,
    Key,
    Phase,
    RevisionEntry,
    RevisionStatus,
    statuses,
)
from loraserve.inference.cache import CachedRevision
from loraserve.inference.engine import AdapterHandle, Engine

log = logging.getLogger(__name__)


class RegistryObserver(Protocol):
    """Counts what the engine tier does (`InferenceMetrics`)."""

    def adapter_load_failed(self, name: str) -> None: ...

    def adapter_missed(self, tier: str) -> None: ...

    def adapter_load_waited(self, source: str, seconds: float) -> None: ...

    def adapter_evicted(self, tier: str) -> None: ...


@dataclass(frozen=True)
class Lease:
    """What a request runs on; `adapter` is None for the base model."""

    name: str
    revision: int
    adapter: AdapterHandle | None


class AdapterRegistry:
    """Routes adapter names to loaded revisions on the engine; make-before-break.

    Invariant: `_routes[name] == r` only while entry (name, r) is READY.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        cache_dir: Path,
        compat: CompatibilityChecker,
        fetcher: RevisionCache | None = None,
        max_pinned: int = 8,
        observer: RegistryObserver | None = None,
    ) -> None:
        if max_pinned < 1:
            raise ValueError(f"max_pinned must be at least 1, got {max_pinned}")
        self._adapters = EngineAdapters(engine, cache_dir, compat, self._spawn)
        self._cache = fetcher
        self._max_pinned = max_pinned
        self._observer = observer
        self._entries: dict[Key, RevisionEntry] = {}
        self._routes: dict[str, int] = {}
        # What each name should route to: loaded now, or on its first request.
        self._targets: dict[str, Revision] = {}
        self._pin_clock = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._loads = RevisionLoads(
            self._entries, self._adapters, fetcher, self._update, self._spawn
        )

    # -- the sync side ---------------------------------------------------------------

    async def install(self, cached: CachedRevision, *, make_current: bool) -> None:
        """Loads `cached` (if not loaded yet), then routes its name to it or pins it.

        Raises FailedPrecondition if the revision is incompatible or the engine
        rejects it; whatever was serving before keeps serving.
        """
        key = (cached.name, cached.revision)
        if make_current:
            self._retarget(cached.manifest)
        claim = self._route_if_target if make_current else self._pin
        try:
            await self._loads.ensure_loaded(
                key, functools.partial(self._loads.obtain, key, cached), claim
            )
        except LoraserveError as exc:
            self._fail(cached.manifest, exc.message)
            raise

    def set_target(self, manifest: Revision) -> None:
        """Routes the name to `manifest` without loading it: its first request will.
        A loaded older revision stops taking new requests at once."""
        previous = self.target_revision(manifest.adapter_name)
        if previous == manifest.revision:
            return
        self._adapters.check_facts(manifest_facts(manifest))
        self._retarget(manifest)
        routed = self._routes.get(manifest.adapter_name)
        if routed is not None and routed != manifest.revision:
            del self._routes[manifest.adapter_name]
            self._update(self._entries[(manifest.adapter_name, routed)])
        if previous is not None:
            # Only a name routed before can have a superseded revision on disk: the
            # start-up sweep left none, so routing thousands at start-up costs no task.
            self._spawn(self._cache_remove_unused(manifest.adapter_name))

    def record_failure(self, manifest: Revision, message: str) -> None:
        """A revision that failed before it reached `install` (refused from its manifest,
        corrupt download): listed as FAILED with the reason, like a failed load."""
        entry = self._entries.get((manifest.adapter_name, manifest.revision))
        if entry is None or entry.phase is Phase.FAILED:
            self._fail(manifest, message)

    async def set_current(self, name: str, revision: int) -> None:
        """Routes `name` to `revision`, loading it again if it was already removed."""
        key = (name, revision)
        entry = await self._loads.ensure_loaded(
            key, functools.partial(self._loads.obtain, key, None), self._promote
        )
        if entry is None:
            raise Unavailable(f"adapter {name}@{revision} left the engine as it loaded; retry")

    async def delete(self, name: str) -> None:
        """Stops routing `name`; its revisions drain, then leave the engine."""
        self._routes.pop(name, None)
        self._targets.pop(name, None)
        for entry in [e for e in self._entries.values() if e.name == name]:
            if entry.phase is Phase.FAILED:
                del self._entries[entry.key]
            elif entry.phase is Phase.LOADING:
                entry.discarded = True
            else:
                entry.pinned_at = 0
                self._update(entry)
        self._spawn(self._cache_remove_unused(name))
        log.info("adapter.unrouted name=%s", name)

    def current_revision(self, name: str) -> int | None:
        return self._routes.get(name)

    def is_installed(self, name: str, revision: int) -> bool:
        entry = self._entries.get((name, revision))
        return entry is not None and entry.phase in (Phase.READY, Phase.DRAINING)

    def holds(self, name: str, revision: int) -> bool:
        """Whether the revision's files are in use: loaded, loading or being removed."""
        entry = self._entries.get((name, revision))
        return entry is not None and entry.phase is not Phase.FAILED

    def target_revision(self, name: str) -> int | None:
        target = self._targets.get(name)
        return target.revision if target is not None else None

    def is_resident(self, name: str) -> bool:
        """Whether a revision of `name` is routed in the engine or loading for it."""
        return name in self._routes or any(
            e.name == name and e.phase is Phase.LOADING for e in self._entries.values()
        )

    def resident_count(self) -> int:
        """Names routed to a revision in the engine."""
        return len(self._routes)

    def slots_in_use(self) -> int:
        """Revisions running requests now: each takes a LoRA slot while batched."""
        return sum(1 for e in self._entries.values() if e.in_flight)

    def routed_count(self) -> int:
        """Names this replica routes, loaded or not."""
        return len(self._targets)

    async def release(self, name: str, revision: int) -> bool:
        """The cache wants the revision's files: takes it out of the engine if nothing
        needs it there (no request on it, not pinned, not loading) and says whether
        the files are free. A routed revision loses its route; its target stays, so
        the next request loads it again."""
        entry = self._entries.get((name, revision))
        if entry is None or entry.phase is Phase.FAILED:
            return True
        if entry.phase is not Phase.READY or entry.in_flight or entry.pinned_at:
            return False
        assert entry.handle is not None
        if self._routes.get(name) == revision:
            del self._routes[name]
        entry.phase, entry.done = Phase.REMOVING, asyncio.Event()
        try:
            await self._adapters.remove(entry.handle)
        except Exception:
            # The id is never reused: a leftover in the engine costs memory only.
            log.exception("adapter.remove_failed name=%s rev=%d", name, revision)
        finally:
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
            entry.done.set()
        if self._observer is not None:
            self._observer.adapter_evicted("engine")
        log.info("adapter.evicted name=%s rev=%d", name, revision)
        return True

    async def settle(self) -> None:
        """Waits until every load and removal started so far has finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the request side ------------------------------------------------------------

    @asynccontextmanager
    async def acquire(self, ref: AdapterRef) -> AsyncIterator[Lease]:
        """Holds the revision `ref` resolves to for the duration of a request."""
        if ref.is_base:
            yield Lease(name="", revision=0, adapter=None)
            return
        if ref.revision is None:
            entry = self._routed_entry(ref.name) or await self._load_on_miss(ref.name)
        else:
            key = (ref.name, ref.revision)
            pinned = await self._loads.ensure_loaded(
                key, functools.partial(self._loads.obtain, key, None), self._pin
            )
            if pinned is None:
                raise Unavailable(f"adapter {ref.name}@{ref.revision} left as it loaded; retry")
            entry = pinned
        entry.in_flight += 1
        if self._cache is not None:
            self._cache.touch(*entry.key)
        try:
            yield Lease(name=entry.name, revision=entry.revision, adapter=entry.handle)
        finally:
            entry.in_flight -= 1
            self._update(entry)

    def loaded_count(self) -> int:
        return sum(1 for e in self._entries.values() if e.phase in IN_ENGINE)

    def snapshot(self, in_host_memory: Callable[[int], bool] | None = None) -> list[RevisionStatus]:
        """Every revision this registry knows, loaded or only targeted, ordered by
        name then revision, each with the tier it is in; `in_host_memory` tells the
        lora_int_ids the engine holds in host memory (else all loaded ones count)."""
        cache = self._cache
        return statuses(
            self._entries,
            self._routes,
            self._targets,
            on_disk=(lambda n, r: cache.is_cached(n, r)) if cache else (lambda n, r: False),
            in_host_memory=in_host_memory or (lambda lora_int_id: True),
        )

    def _routed_entry(self, name: str) -> RevisionEntry | None:
        revision = self._routes.get(name)
        return None if revision is None else self._entries[(name, revision)]

    async def _load_on_miss(self, name: str) -> RevisionEntry:
        """Loads the name's target for a request that found no loaded revision, and
        follows a newer target that arrives meanwhile; NotFound once it is deleted."""
        started = time.monotonic()
        if self._observer is not None:
            self._observer.adapter_missed("engine")
        downloaded = False
        while (entry := self._routed_entry(name)) is None:
            target = self._targets.get(name)
            if target is None:
                raise NotFound(f"adapter {name!r} is not served here")
            key = (name, target.revision)
            loaded = await self._loads.ensure_loaded(
                key, functools.partial(self._loads.fetch, target), self._route_if_target
            )
            downloaded = downloaded or (loaded is not None and loaded.downloaded)
        if self._observer is not None:
            if downloaded:
                self._observer.adapter_missed("disk")
            source = "store" if downloaded else "disk"
            self._observer.adapter_load_waited(source, time.monotonic() - started)
        return entry

    def _fail(self, manifest: Revision, message: str) -> None:
        key = (manifest.adapter_name, manifest.revision)
        self._entries[key] = RevisionEntry(*key, Phase.FAILED, manifest=manifest, error=message)
        if self._observer is not None:
            self._observer.adapter_load_failed(manifest.adapter_name)

    def _retarget(self, manifest: Revision) -> None:
        self._targets[manifest.adapter_name] = manifest

    def _route_if_target(self, entry: RevisionEntry) -> None:
        """Routes a loaded revision that is still its name's target; a stale one is
        left for `_update` to retire."""
        if self.target_revision(entry.name) == entry.revision:
            self._route(entry)

    def _promote(self, entry: RevisionEntry) -> None:
        assert entry.manifest is not None
        self._retarget(entry.manifest)
        self._route(entry)

    async def _cache_remove_unused(self, name: str) -> None:
        """Files of the name's revisions that are neither held nor its target."""
        if self._cache is None:
            return
        target = self.target_revision(name)
        await self._cache.remove_unused(name, lambda n, rev: rev == target or self.holds(n, rev))

    def _route(self, entry: RevisionEntry) -> None:
        previous = self._routes.get(entry.name)
        self._routes[entry.name] = entry.revision
        self._update(entry)
        assert entry.handle is not None
        log.info(
            "adapter.routed name=%s rev=%d lora_int_id=%d previous=%s",
            entry.name,
            entry.revision,
            entry.handle.lora_int_id,
            previous,
        )
        replaced = self._entries.get((entry.name, previous or 0))
        if replaced is not None and replaced is not entry:
            self._update(replaced)

    def _pin(self, entry: RevisionEntry) -> None:
        entry.pinned_at = next(self._pin_clock)
        self._update(entry)
        pinned = sorted(
            (e for e in self._entries.values() if e.pinned_at), key=lambda e: e.pinned_at
        )
        for evicted in pinned[: max(0, len(pinned) - self._max_pinned)]:
            evicted.pinned_at = 0
            self._update(evicted)

    def _update(self, entry: RevisionEntry) -> None:
        """Puts a revision in the engine into the phase its route, pin and requests
        call for; one nothing needs any more starts leaving."""
        if entry.phase not in (Phase.READY, Phase.DRAINING):
            return
        if self._routes.get(entry.name) == entry.revision or entry.pinned_at:
            entry.phase = Phase.READY
        elif entry.in_flight:
            entry.phase = Phase.DRAINING
        else:
            entry.phase = Phase.REMOVING
            entry.done = asyncio.Event()
            self._spawn(self._remove(entry))

    async def _remove(self, entry: RevisionEntry) -> None:
        assert entry.handle is not None
        try:
            await self._adapters.remove(entry.handle)
            await self._loads.release_files(entry.key)
            log.info(
                "adapter.removed name=%s rev=%d lora_int_id=%d",
                *entry.key,
                entry.handle.lora_int_id,
            )
        except Exception:
            # A background task has no caller to tell; the id is never reused, so a
            # leftover adapter in the engine costs memory only, never correctness.
            log.exception("adapter.remove_failed name=%s rev=%d", *entry.key)
        finally:
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
            entry.done.set()

    def _spawn(self, coro: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A load whose callers all gave up has nobody to raise to; it logged already.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task
