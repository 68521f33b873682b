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

    install(cached, make_current=...)   load a fetched revision; route it or pin it
    record_failure(manifest, message)   a revision that could not even be fetched
    set_current(name, revision)         rollback/promote (fetches if no longer loaded)
    delete(name)                        unroute; every revision drains, then goes;
                                        loads in flight are discarded
    current_revision(name), is_installed(name, revision), holds(...), snapshot()
    settle()                            waits for removals in progress (tests, shutdown)

Both sides never load a path that is not inside the adapter cache directory.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loraserve.common.errors import LoraserveError, NotFound, Unavailable
from loraserve.common.manifest import Revision
from loraserve.common.names import AdapterRef
from loraserve.inference.cache import CachedRevision, manifest_facts
from loraserve.inference.compat import CompatibilityChecker
from loraserve.inference.engine import AdapterHandle, Engine
from loraserve.inference.engine_adapters import EngineAdapters
from loraserve.inference.revisionstate import (
    IN_ENGINE,
    Key,
    Phase,
    RevisionEntry,
    RevisionStatus,
    status_of,
)

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


class LoadFailureListener(Protocol):
    def adapter_load_failed(self, name: str) -> None: ...


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
        failures: LoadFailureListener | None = None,
    ) -> None:
        if max_pinned < 1:
            raise ValueError(f"max_pinned must be at least 1, got {max_pinned}")
        self._adapters = EngineAdapters(engine, cache_dir, compat, self._spawn)
        self._cache = fetcher
        self._max_pinned = max_pinned
        self._failures = failures
        self._entries: dict[Key, RevisionEntry] = {}
        self._routes: dict[str, int] = {}
        self._pin_clock = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the sync side ---------------------------------------------------------------

    async def install(self, cached: CachedRevision, *, make_current: bool) -> None:
        """Loads `cached` (if not loaded yet), then routes its name to it or pins it.

        Raises FailedPrecondition if the revision is incompatible or the engine
        rejects it; whatever was serving before keeps serving.
        """
        key = (cached.name, cached.revision)
        try:
            entry = await self._ensure_loaded(key, functools.partial(self._obtain, key, cached))
        except LoraserveError as exc:
            self._fail(cached.manifest, exc.message)
            raise
        if make_current:
            self._route(entry)
        else:
            self._pin(entry)

    def record_failure(self, manifest: Revision, message: str) -> None:
        """A revision that failed before it reached `install` (refused from its manifest,
        corrupt download): listed as FAILED with the reason, like a failed load."""
        entry = self._entries.get((manifest.adapter_name, manifest.revision))
        if entry is None or entry.phase is Phase.FAILED:
            self._fail(manifest, message)

    async def set_current(self, name: str, revision: int) -> None:
        """Routes `name` to `revision`, loading it again if it was already removed."""
        key = (name, revision)
        entry = await self._ensure_loaded(key, functools.partial(self._obtain, key, None))
        self._route(entry)

    async def delete(self, name: str) -> None:
        """Stops routing `name`; its revisions drain, then leave the engine."""
        self._routes.pop(name, None)
        for entry in [e for e in self._entries.values() if e.name == name]:
            if entry.phase is Phase.FAILED:
                del self._entries[entry.key]
            elif entry.phase is Phase.LOADING:
                entry.discarded = True
            else:
                entry.pinned_at = 0
                self._update(entry)
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

    async def settle(self) -> None:
        """Waits until every removal started so far has finished."""
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
            entry = self._current_entry(ref.name)
        else:
            key = (ref.name, ref.revision)
            entry = await self._ensure_loaded(key, functools.partial(self._obtain, key, None))
            self._pin(entry)
        entry.in_flight += 1
        try:
            yield Lease(name=entry.name, revision=entry.revision, adapter=entry.handle)
        finally:
            entry.in_flight -= 1
            self._update(entry)

    def loaded_count(self) -> int:
        return sum(1 for e in self._entries.values() if e.phase in IN_ENGINE)

    def snapshot(self) -> list[RevisionStatus]:
        """Every revision this registry knows, ordered by name then revision."""
        return [status_of(e, self._routes) for _, e in sorted(self._entries.items())]

    # -- internals ---------------------------------------------------------------------

    def _current_entry(self, name: str) -> RevisionEntry:
        revision = self._routes.get(name)
        if revision is None:
            if any(e.name == name and e.phase is Phase.LOADING for e in self._entries.values()):
                raise Unavailable(f"adapter {name!r} is still loading; retry shortly")
            raise NotFound(f"adapter {name!r} is not served here")
        return self._entries[(name, revision)]

    async def _obtain(self, key: Key, given: CachedRevision | None) -> CachedRevision:
        # A revision's files go back to the cache when it leaves the engine; one asked
        # for again after that (a rollback, a pin) is fetched again.
        if given is not None and given.path.is_dir():
            return given
        if self._cache is None:
            raise NotFound(f"adapter {key[0]}@{key[1]} is not loaded here")
        return await self._cache.fetch(*key, given.manifest if given is not None else None)

    async def _ensure_loaded(
        self, key: Key, obtain: Callable[[], Awaitable[CachedRevision]]
    ) -> RevisionEntry:
        while True:
            entry = self._entries.get(key)
            if entry is not None and entry.phase in (Phase.READY, Phase.DRAINING):
                return entry
            if entry is not None and entry.phase in (Phase.LOADING, Phase.REMOVING):
                await entry.done.wait()
                continue
            return await self._load(key, obtain, entry)

    async def _load(
        self,
        key: Key,
        obtain: Callable[[], Awaitable[CachedRevision]],
        failed: RevisionEntry | None,
    ) -> RevisionEntry:
        """Loads a revision that is absent or FAILED; returns it READY but not yet
        routed or pinned: the caller claims it before anything else runs, so a
        fresh revision is never seen unclaimed and retired."""
        entry = RevisionEntry(*key, Phase.LOADING)
        self._entries[key] = entry
        cached: CachedRevision | None = None
        added: AdapterHandle | None = None
        try:
            cached = await obtain()
            entry.manifest, entry.path = cached.manifest, cached.path
            self._check_not_deleted(entry)
            await self._adapters.check(manifest_facts(cached.manifest), cached.path)
            handle = self._adapters.handle(*key, cached.path)
            await self._adapters.add(handle)
            added = handle
            self._check_not_deleted(entry)
            entry.handle, entry.phase = handle, Phase.READY
            log.info("adapter.loaded name=%s rev=%d lora_int_id=%d", *key, handle.lora_int_id)
            return entry
        except Exception:
            await self._adapters.discard(added)
            if cached is not None:
                await self._release(key)
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

    def _fail(self, manifest: Revision, message: str) -> None:
        key = (manifest.adapter_name, manifest.revision)
        self._entries[key] = RevisionEntry(*key, Phase.FAILED, manifest=manifest, error=message)
        if self._failures is not None:
            self._failures.adapter_load_failed(manifest.adapter_name)

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
        if previous is not None and previous != entry.revision:
            self._update(self._entries[(entry.name, previous)])

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
            await self._release(entry.key)
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

    async def _release(self, key: Key) -> None:
        """Hands a revision's files back to the cache, which deletes them."""
        if self._cache is not None:
            await self._cache.remove(*key)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
