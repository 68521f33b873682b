"""Which adapter revisions are in the engine, and where each adapter name routes.

Invariants (the story is docs/design.md, "Inference service"):
- every (name, revision) is its own engine adapter, `NAME@REV` with a `lora_int_id`
  never used before, never loaded in place;
- a name routes only to a READY revision, and its route flips in one synchronous step,
  only after the engine accepted the new revision (make-before-break);
- a revision leaves the engine only when no request runs on it and it is neither
  current nor pinned; its files go back to the cache only after that;
- each name has a target (what the store makes current); a request for a name with no
  loaded revision loads its target (load on miss), and a load routes its revision only
  if it is still the target when it lands;
- a delete wins over every load of that name in flight: nothing of it becomes servable;
- nothing is loaded from outside the cache directory;
- a pinned request (`NAME@REV`) gets only what the pin policy serves (pins.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

from loraserve.clients.store import RolloutSplit
from loraserve.common.config.pins import PinPolicy, PinSettings
from loraserve.common.errors import (
    TRANSIENT_ERRORS,
    LoraserveError,
    NotFound,
    Unavailable,
    rpc_code,
)
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.common.revisions.names import AdapterRef
from loraserve.common.tracing import child_span, tracer
from loraserve.inference.adapters.arms import CandidateArms
from loraserve.inference.adapters.compat import CompatibilityChecker, manifest_facts
from loraserve.inference.adapters.in_engine import EngineAdapters
from loraserve.inference.adapters.loads import RevisionLoads
from loraserve.inference.adapters.pins import PinParts, Pins
from loraserve.inference.adapters.ports import RegistryObserver, RevisionCache
from loraserve.inference.adapters.published import PublishTraces
from loraserve.inference.adapters.registry_reads import RegistryReads
from loraserve.inference.adapters.state import RevisionEntry, RevisionLife
from loraserve.inference.engine import AdapterHandle, Engine

log = logging.getLogger(__name__)
_TRACER = tracer(__name__)


@dataclass(frozen=True)
class Lease:
    """What a request runs on; `adapter` is None for the base model. `published_by`: the
    trace that routed the revision here, for the first request it serves (published.py)."""

    name: str
    revision: int
    adapter: AdapterHandle | None
    published_by: str = ""


class AdapterRegistry(RegistryReads):
    """Routes adapter names to loaded revisions on the engine; see the module docstring.
    What it holds is read through `RegistryReads`."""

    def __init__(
        self,
        engine: Engine,
        cache: RevisionCache,
        compat: CompatibilityChecker,
        *,
        pins: PinSettings | None = None,
        observer: RegistryObserver | None = None,
        on_change: Callable[[str], None] = lambda name: None,
        verify: Callable[[Revision], object] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`pins`: which pinned revisions requests may ask for (default: PinSettings());
        `clock` (monotonic seconds) says how long pins have been idle."""
        self._adapters = EngineAdapters(engine, cache.root, compat, self._spawn)
        self._cache = cache
        self._observer = observer
        # The signature check (RevisionTrust) of a revision routed without a load.
        self._verify = verify
        self._entries: dict[RevisionKey, RevisionEntry] = {}
        self._routes: dict[str, int] = {}
        # What each name should route to: loaded now, or on its first request.
        self._targets: dict[str, Revision] = {}
        self._published = PublishTraces()
        self._tasks: set[asyncio.Task[None]] = set()
        self._loads = RevisionLoads(
            self._entries, self._adapters, cache, self, self._update, self._spawn
        )
        # What the name reports to the store may have changed (sync's reporter).
        self._changed = on_change
        self._arms = CandidateArms(
            self._entries,
            self._loads,
            self._adapters.check_facts,
            self.mark_failed,
            self._update,
            on_change,
            observer,
        )
        parts = PinParts(
            self._entries,
            self._targets,
            self._loads,
            self._arms,
            self._routed_entry,
            self._route_if_target,
            self._update,
        )
        self._pins = Pins(pins or PinSettings(), parts, clock)

    @property
    def pin_policy(self) -> PinPolicy:
        """Which pinned revisions this registry serves (listed by /v1/models)."""
        return self._pins.settings.policy

    # -- what the store asks for (sync) -------------------------------------------

    async def install(self, manifest: Revision, *, make_current: bool) -> None:
        """Fetches and loads the revision (if not loaded yet), then routes its name to
        it or pins it. Raises FailedPrecondition if the revision is incompatible or the
        engine rejects it, DataLoss or NotFound (each then listed as FAILED), or a
        transient error to be retried; whatever was serving keeps serving."""
        if make_current:
            self._targets[manifest.adapter_name] = manifest
            self._published.record(manifest.key)
        claim = self._route_if_target if make_current else self._pins.claim
        try:
            await self._loads.ensure_loaded(manifest.key, manifest, claim)
        except TRANSIENT_ERRORS:
            raise
        except LoraserveError as exc:
            self.mark_failed(manifest, exc)
            raise

    def set_target(self, manifest: Revision) -> None:
        """Routes the name to `manifest` without loading it: its first request will.
        A loaded older revision stops taking new requests at once. Raises
        FailedPrecondition (and lists the revision as FAILED) if this server could not
        serve it, judged from the manifest."""
        name = manifest.adapter_name
        previous = self.target_revision(name)
        if previous == manifest.revision:
            return
        try:
            self._verify(manifest)
            self._adapters.check_facts(manifest_facts(manifest))
        except LoraserveError as exc:
            self.mark_failed(manifest, exc)
            raise
        self._targets[name] = manifest
        self._published.record(manifest.key)
        self._changed(name)
        routed = self._routes.get(name)
        if routed is not None and routed != manifest.revision:
            del self._routes[name]
            self._update(self._entries[RevisionKey(name, routed)])
        if previous is not None:
            # Only a name routed before can have a superseded revision on disk: the
            # start-up sweep left none, so routing thousands at start-up costs no task.
            self._spawn(self._cache_remove_unused(name))

    async def set_current(self, name: str, revision: int) -> None:
        """Routes `name` to `revision`, loading it again if it was already removed."""
        self._published.record(RevisionKey(name, revision))
        entry = await self._loads.ensure_loaded(RevisionKey(name, revision), None, self._promote)
        if entry is None:
            raise Unavailable(f"adapter {name}@{revision} left the engine as it loaded; retry")

    def set_rollout(self, name: str, split: RolloutSplit) -> None:
        """Sends `split.weight` percent of the name's requests to its candidate (see
        arms.py); FailedPrecondition when the candidate cannot run here."""
        self._arms.set(name, split)

    def end_rollout(self, name: str) -> None:
        self._arms.end(name)

    async def install_candidate(self, name: str) -> None:
        """Loads the rollout's candidate ahead of its first request."""
        await self._arms.install(name)

    async def delete(self, name: str) -> None:
        """Stops routing `name`; its revisions drain, then leave the engine."""
        self._arms.end(name)
        self._routes.pop(name, None)
        self._targets.pop(name, None)
        self._published.forget(name)
        for entry in [e for e in self._entries.values() if e.name == name]:
            if entry.state is RevisionLife.FAILED:
                del self._entries[entry.key]
            elif entry.state is RevisionLife.LOADING:
                entry.discarded = True
            else:
                entry.pinned_at = 0
                self._update(entry)
        self._spawn(self._cache_remove_unused(name))
        self._changed(name)
        log.info("adapter.unrouted name=%s", name)

    async def release(self, name: str, revision: int) -> bool:
        """The cache wants the revision's files (`Holder`): takes it out of the engine
        if nothing needs it there and says whether the files are free. A routed
        revision loses its route; its target stays, so the next request reloads it."""
        entry = self._entries.get(RevisionKey(name, revision))
        if entry is None or entry.state is RevisionLife.FAILED:
            return True
        if not entry.releasable:
            return False
        assert entry.handle is not None
        if self._routes.get(name) == revision:
            del self._routes[name]
        entry.state, entry.done = RevisionLife.REMOVING, asyncio.Event()
        try:
            await self._adapters.remove(entry.handle)
        except Exception:
            # The id is never reused: a leftover in the engine costs memory only.
            log.exception("adapter.remove_failed name=%s rev=%d", name, revision)
        finally:
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
            entry.done.set()
            self._changed(name)
        if self._observer is not None:
            self._observer.adapter_evicted("engine")
        log.info("adapter.evicted name=%s rev=%d", name, revision)
        return True

    def set_yanks(self, yanks: Mapping[RevisionKey, str]) -> None:
        """The store's yanked revisions (with why), all of them: their pins are refused
        from now on, and a pinned one here drains and leaves."""
        self._pins.set_yanks(yanks)

    async def wait_background(self) -> None:
        """Waits until every load and removal started so far has finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what requests ask for ----------------------------------------------------

    @asynccontextmanager
    async def acquire(self, ref: AdapterRef, rollout_key: str = "") -> AsyncIterator[Lease]:
        """Holds the revision `ref` resolves to for the duration of a request; a
        rollout's split picks the arm of an unpinned one (by `rollout_key`)."""
        if ref.is_base:
            yield Lease(name="", revision=0, adapter=None)
            return
        if ref.revision is None:
            entry = (
                await self._arms.entry_for(ref.name, rollout_key)
                or self._routed_entry(ref.name)
                or await self._load_on_miss(ref.name)
            )
        else:
            entry = await self._pins.entry_for(RevisionKey(ref.name, ref.revision))
        entry.in_flight += 1
        self._cache.touch(*entry.key)
        try:
            yield Lease(entry.name, entry.revision, entry.handle, self._published.take(*entry.key))
        finally:
            entry.in_flight -= 1
            self._update(entry)

    def _routed_entry(self, name: str) -> RevisionEntry | None:
        revision = self._routes.get(name)
        return None if revision is None else self._entries[RevisionKey(name, revision)]

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
            loaded = await self._loads.ensure_loaded(target.key, target, self._route_if_target)
            downloaded = downloaded or (loaded is not None and loaded.downloaded)
        if self._observer is not None:
            if downloaded:
                self._observer.adapter_missed("disk")
            source = "store" if downloaded else "disk"
            self._observer.adapter_load_waited(source, time.monotonic() - started)
        return entry

    def mark_failed(self, manifest: Revision, error: Exception) -> None:
        """Lists a revision that cannot run here as FAILED with the reason (a NACK to
        the store), unless a load of it is under way or it is in the engine."""
        entry = self._entries.get(manifest.key)
        if entry is not None and entry.state is not RevisionLife.FAILED:
            return
        message = error.message if isinstance(error, LoraserveError) else type(error).__name__
        self._entries[manifest.key] = RevisionEntry(
            manifest.key,
            RevisionLife.FAILED,
            manifest=manifest,
            error=message,
            error_code=rpc_code(error),
        )
        self._changed(manifest.adapter_name)
        if self._observer is not None:
            self._observer.adapter_load_failed(manifest.adapter_name)

    def _route_if_target(self, entry: RevisionEntry) -> None:
        """Routes a loaded revision that is still its name's target; a stale one is
        left for `_update` to retire."""
        if self.target_revision(entry.name) == entry.revision:
            self._route(entry)

    def _promote(self, entry: RevisionEntry) -> None:
        assert entry.manifest is not None
        self._targets[entry.name] = entry.manifest
        self._route(entry)

    async def _cache_remove_unused(self, name: str) -> None:
        """Files of the name's revisions that are neither in use nor its target."""
        target = self.target_revision(name)
        await self._cache.remove_unused(
            name, lambda n, rev: rev == target or self.uses_files(n, rev)
        )

    def _route(self, entry: RevisionEntry) -> None:
        # The flip itself: instant, but where it falls in the push's trace is the point.
        with child_span(_TRACER, "loraserve.replica.route") as span:
            previous = self._routes.get(entry.name)
            if span.is_recording():
                span.set_attribute("loraserve.previous_revision", previous or 0)
            self._routes[entry.name] = entry.revision
            self._update(entry)
            self._changed(entry.name)
            assert entry.handle is not None
            log.info(
                "adapter.routed name=%s rev=%d lora_int_id=%d previous=%s",
                entry.name,
                entry.revision,
                entry.handle.lora_int_id,
                previous,
            )
            replaced = self._entries.get(RevisionKey(entry.name, previous or 0))
            if replaced is not None and replaced is not entry:
                self._update(replaced)

    def _update(self, entry: RevisionEntry) -> None:
        """Puts a revision in the engine into the state its route, pin and requests
        call for; one nothing needs any more starts leaving."""
        if entry.state not in (RevisionLife.READY, RevisionLife.DRAINING):
            return
        if (
            self._routes.get(entry.name) == entry.revision
            or entry.pinned_at
            or self._arms.holds(entry)
        ):
            entry.state = RevisionLife.READY
            if entry.releasable:
                self._cache.hold_ended()
        elif entry.in_flight:
            entry.state = RevisionLife.DRAINING
        else:
            entry.state = RevisionLife.REMOVING
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
