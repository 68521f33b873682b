"""Keeps the served adapters in step with the store: list, then watch.

Invariants: start-up costs the listing plus at most `prefetch_adapters` loads,
whatever the adapter count (everything else is only routed and loads on its first
request); one adapter's slow load never holds up another's (a worker per adapter,
events for one adapter fold into one load); every change is applied at most once and
none is missed (a watch resumes after the last event taken in; OUT_OF_RANGE or a hole
in the seqs lists again); a permanent failure is NACKed and the previous revision
keeps serving, a transient one is retried on stamina's schedule. The story, and what
is loaded when: docs/design.md ("Residency", "Hot swap", "Sync").
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

import stamina

from loraserve.clients.store import Listing, StoreEvent
from loraserve.common import errors
from loraserve.common.errors import LoraserveError
from loraserve.common.rpc import retrylog
from loraserve.inference.sync.apply import Registry, RevisionApplier, SwapObserver
from loraserve.inference.sync.generations import heartbeat_from_elsewhere, names_to_forget
from loraserve.inference.sync.quotas import QuotaFollower, QuotaSink
from loraserve.inference.sync.reports import CountersSource, StatusReporter
from loraserve.inference.sync.seams import DiskCache, StoreAPI, SyncSettings
from loraserve.inference.sync.spans import applying, settled
from loraserve.inference.sync.state import AdapterWish, SyncState
from loraserve.inference.sync.worker import AdapterWorker, RetryHook
from loraserve.inference.sync.yanks import YankFollower, YankSink

log = logging.getLogger(__name__)


class Synchronizer:
    """Applies the store's adapters to the registry; `run()` until cancelled."""

    def __init__(
        self,
        store: StoreAPI,
        registry: Registry,
        cache: DiskCache | None = None,
        settings: SyncSettings | None = None,
        observe_swap: SwapObserver | None = None,
        changed: set[str] | None = None,
        counters: CountersSource | None = None,
        ttft_bounds: tuple[float, ...] = (),
        quotas: QuotaSink | None = None,
        yanks: YankSink | None = None,
    ) -> None:
        """`changed`: what the registry adds changed names to (its `on_change`);
        `quotas`: what enforces the store's quotas (the serving QuotaGate); `yanks`:
        what refuses yanked revisions' pins (the registry)."""
        self._store = store
        self._cache = cache
        self._registry = registry
        self._settings = settings or SyncSettings()
        self._state = SyncState()
        self._workers: dict[str, AdapterWorker] = {}
        self.reporter = StatusReporter(
            store,
            registry,
            self._settings.reports,
            lambda: (self.applied_seq, self._state.incarnation or ""),
            changed if changed is not None else set(),
            counters,
            ttft_bounds,
        )
        self._applier = RevisionApplier(
            registry,
            self._state,
            self.reporter.mark,
            self._settings.max_concurrent_loads,
            observe_swap,
        )
        self._quotas = QuotaFollower(quotas)
        self._yanks = YankFollower(yanks)
        self._initial_seq: int | None = None
        # The watch fell behind the store's log: list again before watching.
        self._behind = False
        self.initial_sync_done = asyncio.Event()

    @property
    def applied_seq(self) -> int:
        """Every change up to this seq is applied (or rejected)."""
        return self._state.applied_seq()

    async def run(self) -> None:
        keep_alive = asyncio.create_task(self.reporter.run(), name="sync:reports")
        try:
            await self._list_and_reconcile()
            await self._watch_forever()
        finally:
            tasks = [keep_alive, *(worker.task for worker in self._workers.values())]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _retrying(self, on: RetryHook) -> AsyncIterator[stamina.Attempt]:
        """Retries without end (until cancelled) on the sync schedule."""
        return retrylog.retry_context(
            "inference.sync",
            on=on,
            attempts=None,
            timeout=None,
            wait_initial=self._settings.initial_backoff_s,
            wait_max=self._settings.max_backoff_s,
            wait_jitter=self._settings.initial_backoff_s,
        )

    async def _watch_forever(self) -> None:
        """Watches until cancelled. Each connection starts the schedule afresh: the
        loss of a watch that had connected is the first failure of a new schedule."""
        lost: Exception | None = None
        while True:
            async for attempt in self._retrying(self._on_watch_failure):
                with attempt:
                    if lost is not None:
                        failure, lost = lost, None
                        raise failure
                    if self._behind:
                        await self._list_and_reconcile()
                        self._behind = False
                    lost = await self._watch()

    async def _watch(self) -> Exception:
        """Watches after the last event taken in until the watch fails. The failure
        is raised if the watch never connected, returned once it had."""
        after = self._state.received_seq
        log.info("sync.watch_started after_seq=%d", after)
        connected = False
        try:
            incarnation = self._state.incarnation or ""
            async with aclosing(self._store.watch(after, incarnation)) as stream:
                async for item in stream:
                    connected = True
                    if isinstance(item, StoreEvent):
                        self._take_event(item)
                    elif why := heartbeat_from_elsewhere(item, self._state):
                        raise _MissedEvents(why)
            raise errors.Unavailable("the store ended the watch stream")
        except Exception as exc:
            if connected:
                return exc
            raise

    def _on_watch_failure(self, exc: BaseException) -> bool:
        after = self._state.received_seq
        if isinstance(exc, errors.OutOfRange | _MissedEvents):
            # Paced like a reconnect, so a store that keeps refusing is not hammered.
            self._behind = True
            log.warning("sync.watch_behind after_seq=%d reason=%s", after, exc)
        elif isinstance(exc, errors.LoraserveError):
            log.warning("sync.watch_lost after_seq=%d reason=%s", after, exc)
        elif isinstance(exc, Exception):
            # A bug here must not leave the replica frozen on stale adapters forever.
            log.error("sync.watch_bug after_seq=%d", after, exc_info=exc)
        else:
            return False
        return True

    async def _list_and_reconcile(self) -> None:
        listing = await self._list()
        served = self._state.served | {
            name for name in self._state.wishes if self._registry.current_revision(name)
        }
        seen_at = None if self._initial_seq is None else time.monotonic()
        held = self._registry.held()
        forget = names_to_forget(
            listing,
            incarnation=self._state.incarnation,
            received_seq=self._state.received_seq,
            known=served | held.keys() | self._state.wishes.keys(),
            holds_older_than=lambda name, seq: held.get(name, seq) < seq,
        )
        changed = self._state.record_listing(listing, served, seen_at, frozenset(forget))
        self._quotas.take_listing(listing)
        self._yanks.take_listing(listing)
        if self._initial_seq is None:
            self._initial_seq = listing.seq
            await self._sweep(listing)
            warm = self._prefetch_set(listing)
        else:
            warm = self._warm_after_relist(changed)
        routed = 0
        for name in changed:
            if name not in warm and self._route_lazily(name):
                routed += 1
            else:
                self._wake(name)
        log.info(
            "sync.listed seq=%d adapters=%d changed=%d warm=%d routed_lazily=%d",
            listing.seq,
            len(listing.adapters),
            len(changed),
            len(warm),
            routed,
        )
        self._note_progress()

    def _prefetch_set(self, listing: Listing) -> set[str]:
        """At most `prefetch_adapters` listed names: the ones served most recently
        (the cache's index), then the others in listing order."""
        listed = [a.name for a in listing.adapters if a.current is not None]
        known = set(listed)
        recent = [n for n in (self._cache.recent_names() if self._cache else []) if n in known]
        ordered = dict.fromkeys([*recent, *listed])
        return set(list(ordered)[: self._settings.prefetch_adapters])

    def _warm_after_relist(self, changed: list[str]) -> set[str]:
        """Names a relisting loads: resident ones, and new routes while fewer than
        `prefetch_adapters` are resident, as if their events had been watched."""
        room = (
            self._settings.prefetch_adapters
            - self._registry.counts().resident
            - len(self._applier.loading)
        )
        warm = set()
        for name in changed:
            wish = self._state.wishes.get(name)
            if self._registry.is_resident(name):
                warm.add(name)
            elif (
                wish is not None
                and wish.current is not None
                and room > 0
                and self._registry.target_revision(name) != wish.current.revision
            ):
                warm.add(name)
                room -= 1
        return warm

    def _route_lazily(self, name: str) -> bool:
        """Settles a listed adapter by routing it without loading, when nothing else
        is asked of it; False leaves it to its worker (a load, a delete, a NACK)."""
        wish = self._state.wishes.get(name)
        if (
            wish is None
            or wish.current is None
            or wish.delete_seq
            or wish.preload
            or wish.rollout is not None
            or self._registry.split_of(name) is not None
            or self._registry.is_resident(name)
            or name in self._applier.loading
            or name in self._workers
        ):
            return False
        try:
            self._registry.set_target(wish.current)
        except LoraserveError:
            return False
        self._state.served.add(name)
        self.reporter.mark(name)
        return self._state.mark_applied(name, wish.version)

    async def _list(self) -> Listing:
        listing: Listing | None = None
        async for attempt in self._retrying(_on_list_failure):
            with attempt:
                listing = await self._store.list_adapters()
        assert listing is not None
        return listing

    async def _sweep(self, listing: Listing) -> None:
        """Before any worker runs: keeps what the listing routes and what requests
        already hold; the rest of the cache is an earlier run's leftovers."""
        if self._cache is None:
            return
        current = {(a.name, a.current.revision) for a in listing.adapters if a.current is not None}
        await self._cache.sweep(
            lambda name, rev: (name, rev) in current or self._registry.uses_files(name, rev)
        )

    def _take_event(self, event: StoreEvent) -> None:
        if self._state.is_replay(event):
            return
        if self._state.is_gap(event):
            raise _MissedEvents(
                f"event seq {event.seq} after seq {self._state.received_seq}; listing again"
            )
        log.info(
            "sync.event seq=%d type=%s name=%s rev=%d current=%d",
            event.seq,
            event.kind.name,
            event.name,
            event.revision.revision if event.revision else 0,
            event.current_revision,
        )
        if self._yanks.take_event(event) or self._quotas.take_event(event):
            # Applied at once, whatever the adapter's worker is doing.
            self._state.received_seq = event.seq
            return
        self._state.record_event(event, time.monotonic())
        self._wake(event.name)

    def _wake(self, name: str) -> None:
        worker = self._workers.get(name)
        if worker is None:
            worker = self._workers[name] = AdapterWorker(name)
            worker.task = asyncio.create_task(self._work(worker), name=f"sync:{name}")
        else:
            worker.wake()

    async def _work(self, worker: AdapterWorker) -> None:
        """Applies the adapter's latest wish until it holds; exits when it does."""
        name = worker.name
        try:
            while (wish := self._state.wishes.get(name)) is not None:
                version = wish.version
                applied = await worker.apply(
                    functools.partial(self._apply, name, wish), self._retrying
                )
                if applied and self._state.mark_applied(name, version):
                    self._note_progress()
                    return
        finally:
            if self._workers.get(name) is worker:
                del self._workers[name]

    async def _apply(self, name: str, wish: AdapterWish) -> None:
        target = wish.current
        with applying(name, wish, self._settings.replica_id) as span:
            await self._apply_wish(name, wish)
            settled(span, target is not None and self._registry.is_loaded(*target.key))

    async def _apply_wish(self, name: str, wish: AdapterWish) -> None:
        if wish.delete_seq:
            delete_seq = wish.delete_seq
            await self._applier.delete(name)
            if wish.delete_seq == delete_seq:
                wish.delete_seq = 0
        target = wish.current
        if target is not None and self._applier.wants(target):
            if self._keeps_warm(name):
                await self._applier.serve(target, make_current=True, seen_at=wish.current_seen_at)
            else:
                await self._applier.route(target)
        for revision, manifest in sorted(wish.preload.items()):
            # Loaded ahead only for an adapter in the engine: promoting it stays warm.
            if self._registry.is_resident(name):
                await self._applier.preload(manifest)
            wish.preload.pop(revision, None)
        await self._applier.split(name, wish.rollout)

    def _keeps_warm(self, name: str) -> bool:
        """Whether a new current revision is loaded before its route moves: for an
        adapter in the engine, or a new one while fewer than `prefetch_adapters` are."""
        loading = self._applier.loading
        return (
            self._registry.is_resident(name)
            or name in loading
            or self._registry.counts().resident + len(loading) < self._settings.prefetch_adapters
        )

    def _note_progress(self) -> None:
        if (
            self._initial_seq is not None
            and not self.initial_sync_done.is_set()
            and self.applied_seq >= self._initial_seq
        ):
            log.info("sync.initial_done seq=%d", self._initial_seq)
            self.initial_sync_done.set()


class _MissedEvents(Exception):
    """The watch skipped seqs; only a fresh listing can say what changed."""


def _on_list_failure(exc: BaseException) -> bool:
    if not isinstance(exc, errors.LoraserveError):
        return False
    log.warning("sync.list_failed reason=%s", exc)
    return True
