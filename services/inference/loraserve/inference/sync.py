"""Keeps the served adapters in step with the store: list, then watch.

Start-up lists the store (a snapshot at seq S), loads every current revision and
reports ACK or NACK, sets `initial_sync_done`, and watches from S. Each event is
applied by the adapter's own worker, so a slow download of one adapter never
holds up another, and events that queue up for one adapter fold into one load
(`syncstate`). A lost watch reconnects with backoff and resumes after the last
event taken in; OUT_OF_RANGE (or a hole in the seqs) lists again and reconciles.
The first listing also decides which cached revisions an earlier run left behind
are worth keeping: the listing's current ones; the rest are swept from disk.

Failures follow the xDS model: a transient error (store or engine unavailable)
is retried with backoff; a permanent one (incompatible adapter, corrupt data,
revision gone) is NACKed once with its reason and the previous revision keeps
serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from loraserve.common import errors
from loraserve.common.backoff import Backoff
from loraserve.inference.compat import serves_base_model
from loraserve.inference.registry import LocalRevision
from loraserve.inference.store_client import (
    Heartbeat,
    Listing,
    Report,
    ReportKind,
    RevisionManifest,
    StoreEvent,
    rpc_code,
)
from loraserve.inference.syncstate import AdapterWish, SyncState

log = logging.getLogger(__name__)

# Worth retrying: the condition may pass. Everything else is NACKed once.
TRANSIENT_ERRORS: tuple[type[errors.LoraserveError], ...] = (
    errors.Unavailable,
    errors.DeadlineExceeded,
    errors.Cancelled,
    errors.ResourceExhausted,
    errors.Aborted,
)


class StoreAPI(Protocol):
    """The calls the synchronizer makes to the store (`StoreClient`, or a fake)."""

    async def list_adapters(self, base_model: str = "") -> Listing: ...

    def watch(self, after_seq: int) -> AsyncGenerator[StoreEvent | Heartbeat, None]: ...

    async def report(self, report: Report) -> None: ...

    async def alive(self) -> bool: ...


class Fetcher(Protocol):
    async def fetch(self, name: str, revision: int) -> LocalRevision: ...


class Sweeper(Protocol):
    """Removes cached revisions nothing needs (`AdapterCache`)."""

    async def sweep(self, keep: Callable[[str, int], bool]) -> None: ...


class Registry(Protocol):
    """The part of `AdapterRegistry` that sync drives."""

    async def install(self, rev: LocalRevision, *, make_current: bool) -> None: ...

    async def set_current(self, name: str, revision: int) -> None: ...

    async def delete(self, name: str) -> None: ...

    def current_revision(self, name: str) -> int | None: ...

    def is_installed(self, name: str, revision: int) -> bool: ...

    def holds(self, name: str, revision: int) -> bool: ...

    def record_failure(self, name: str, revision: int, rank: int, message: str) -> None: ...


SwapObserver = Callable[[float], None]
"""Called with the seconds from event received to route flipped (metrics' swap latency)."""


@dataclass(frozen=True)
class SyncSettings:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    # Downloads and loads at once, so a start-up with many adapters stays bounded.
    max_concurrent_loads: int = 4
    # Seconds between signs of life to the store, which shows this replica's
    # statuses only while they keep coming (its --status-ttl must be longer).
    status_interval_s: float = 60.0


class Synchronizer:
    """Applies the store's adapters to the registry; `run()` until cancelled."""

    def __init__(
        self,
        store: StoreAPI,
        fetcher: Fetcher,
        registry: Registry,
        settings: SyncSettings | None = None,
        observe_swap: SwapObserver | None = None,
        sweeper: Sweeper | None = None,
    ) -> None:
        self._store = store
        self._sweeper = sweeper
        self._fetcher = fetcher
        self._registry = registry
        self._settings = settings or SyncSettings()
        self._observe_swap = observe_swap
        self._state = SyncState()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._load_slots = asyncio.Semaphore(self._settings.max_concurrent_loads)
        # Revisions rejected for good: not retried until an event asks for them again.
        self._rejected: set[tuple[str, int]] = set()
        # Non-current revisions already loaded (or rejected) once.
        self._preloaded: set[tuple[str, int]] = set()
        self._served: set[str] = set()
        # The latest report per adapter that could not be sent; resent on reconnect.
        self._unsent: dict[str, Report] = {}
        # The latest ACK or NACK per adapter, sent again when the store forgot them.
        self._latest: dict[str, Report] = {}
        self._initial_seq: int | None = None
        self.initial_sync_done = asyncio.Event()

    @property
    def applied_seq(self) -> int:
        """Every change up to this seq is applied (or rejected)."""
        return self._state.applied_seq()

    async def run(self) -> None:
        keep_alive = asyncio.create_task(self._keep_alive(), name="sync:alive")
        try:
            await self._list_and_reconcile()
            await self._watch_forever()
        finally:
            workers = [keep_alive, *self._workers.values()]
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _watch_forever(self) -> None:
        backoff = self._backoff()
        while True:
            after = self._state.received_seq
            try:
                log.info("sync.watch_started after_seq=%d", after)
                connected = False
                async with aclosing(self._store.watch(after)) as stream:
                    async for item in stream:
                        if not connected:
                            connected = True
                            backoff.reset()
                            await self._resend_reports()
                        if isinstance(item, StoreEvent):
                            self._take_event(item)
                raise errors.Unavailable("the store ended the watch stream")
            except (errors.OutOfRange, _MissedEvents) as exc:
                # Paced like a reconnect, so a store that keeps refusing is not hammered.
                delay = backoff.next_delay()
                log.warning(
                    "sync.watch_behind after_seq=%d relist_in=%.2fs reason=%s", after, delay, exc
                )
                await asyncio.sleep(delay)
                await self._list_and_reconcile()
            except errors.LoraserveError as exc:
                delay = backoff.next_delay()
                log.warning(
                    "sync.watch_lost after_seq=%d retry_in=%.2fs reason=%s",
                    self._state.received_seq,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
            except Exception:
                # A bug here must not leave the replica frozen on stale adapters forever.
                delay = backoff.next_delay()
                log.exception("sync.watch_bug after_seq=%d retry_in=%.2fs", after, delay)
                await asyncio.sleep(delay)

    async def _list_and_reconcile(self) -> None:
        backoff = self._backoff()
        while True:
            try:
                listing = await self._store.list_adapters()
                break
            except errors.LoraserveError as exc:
                delay = backoff.next_delay()
                log.warning("sync.list_failed retry_in=%.2fs reason=%s", delay, exc)
                await asyncio.sleep(delay)
        served = self._served | {
            name for name in self._state.wishes if self._registry.current_revision(name)
        }
        seen_at = None if self._initial_seq is None else time.monotonic()
        changed = self._state.record_listing(listing, served, seen_at)
        log.info(
            "sync.listed seq=%d adapters=%d changed=%d",
            listing.seq,
            len(listing.adapters),
            len(changed),
        )
        if self._initial_seq is None:
            self._initial_seq = listing.seq
            await self._sweep(listing)
        for name in changed:
            self._wake(name)
        self._note_progress()

    async def _sweep(self, listing: Listing) -> None:
        """Before any worker runs: keeps what the listing routes and what requests
        already hold; the rest of the cache is an earlier run's leftovers."""
        if self._sweeper is None:
            return
        current = {(a.name, a.current.revision) for a in listing.adapters if a.current is not None}
        await self._sweeper.sweep(
            lambda name, rev: (name, rev) in current or self._registry.holds(name, rev)
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
        if event.revision is not None:
            # Asked for again: a revision rejected before gets one more try.
            self._rejected.discard((event.name, event.revision.revision))
        self._state.record_event(event, time.monotonic())
        self._wake(event.name)

    def _wake(self, name: str) -> None:
        self._wakeups.setdefault(name, asyncio.Event()).set()
        if name not in self._workers:
            self._workers[name] = asyncio.create_task(self._work(name), name=f"sync:{name}")

    async def _work(self, name: str) -> None:
        """Applies the adapter's latest wish until it holds; exits when it does."""
        backoff = self._backoff()
        wakeup = self._wakeups.setdefault(name, asyncio.Event())
        try:
            while True:
                wakeup.clear()
                wish = self._state.wishes.get(name)
                if wish is None:
                    return
                version = wish.version
                try:
                    await self._apply(name, wish)
                except TRANSIENT_ERRORS as exc:
                    delay = backoff.next_delay()
                    log.warning(
                        "sync.apply_retry name=%s retry_in=%.2fs reason=%s", name, delay, exc
                    )
                    # A newer event cuts the wait short: it may not need what failed.
                    try:
                        async with asyncio.timeout(delay):
                            await wakeup.wait()
                    except TimeoutError:
                        pass
                    continue
                backoff.reset()
                if self._state.settle(name, version):
                    self._note_progress()
                    return
        finally:
            if self._workers.get(name) is asyncio.current_task():
                del self._workers[name]
                self._wakeups.pop(name, None)

    async def _apply(self, name: str, wish: AdapterWish) -> None:
        if wish.delete_seq:
            delete_seq = wish.delete_seq
            await self._delete(name)
            if wish.delete_seq == delete_seq:
                wish.delete_seq = 0
        target = wish.current
        if target is not None and self._wants(target):
            await self._serve(target, make_current=True, seen_at=wish.current_seen_at)
        for revision, manifest in sorted(wish.preload.items()):
            key = (name, revision)
            if key in self._preloaded or self._registry.is_installed(name, revision):
                wish.preload.pop(revision, None)
                continue
            await self._serve(manifest, make_current=False, seen_at=None)
            self._preloaded.add(key)
            wish.preload.pop(revision, None)

    def _wants(self, target: RevisionManifest) -> bool:
        if (target.name, target.revision) in self._rejected:
            return False
        return self._registry.current_revision(target.name) != target.revision

    async def _serve(
        self, manifest: RevisionManifest, *, make_current: bool, seen_at: float | None
    ) -> None:
        """Loads a revision (routing it if asked) and reports the outcome; transient
        failures propagate to be retried, permanent ones are NACKed here."""
        name, revision = manifest.name, manifest.revision
        try:
            async with self._load_slots:
                if self._registry.is_installed(name, revision):
                    if make_current:
                        await self._registry.set_current(name, revision)
                else:
                    local = await self._fetch(manifest)
                    await self._registry.install(local, make_current=make_current)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            await self._reject(manifest, exc)
            return
        self._served.add(name)
        if make_current and seen_at is not None:
            latency = time.monotonic() - seen_at
            log.info("adapter.routed name=%s rev=%d swap_s=%.3f", name, revision, latency)
            if self._observe_swap is not None:
                self._observe_swap(latency)
        else:
            log.info("adapter.loaded name=%s rev=%d current=%s", name, revision, make_current)
        await self._report(Report(name, revision, ReportKind.ACK, self._serving_revision(name)))

    async def _fetch(self, manifest: RevisionManifest) -> LocalRevision:
        try:
            return await self._fetcher.fetch(manifest.name, manifest.revision)
        except TRANSIENT_ERRORS:
            raise
        except errors.LoraserveError as exc:
            # Never reached the registry: let it list the revision as FAILED anyway.
            self._registry.record_failure(
                manifest.name, manifest.revision, manifest.rank, exc.message
            )
            raise

    async def _reject(self, manifest: RevisionManifest, exc: Exception) -> None:
        name, revision = manifest.name, manifest.revision
        self._rejected.add((name, revision))
        if isinstance(exc, errors.LoraserveError):
            message = exc.message
            log.warning(
                "adapter.rejected name=%s rev=%d code=%s reason=%s",
                name,
                revision,
                exc.code.name,
                message,
            )
        else:
            # A bug of ours or an engine error we did not foresee: report it and keep
            # syncing the other adapters rather than stopping.
            message = f"internal error loading the revision: {type(exc).__name__}"
            log.error("adapter.load_bug name=%s rev=%d", name, revision, exc_info=exc)
        await self._report(
            Report(
                name,
                revision,
                ReportKind.NACK,
                self._serving_revision(name),
                error_code=rpc_code(exc),
                error_message=message,
            )
        )

    async def _delete(self, name: str) -> None:
        served = self._serving_revision(name)
        await self._registry.delete(name)
        self._served.discard(name)
        self._rejected = {key for key in self._rejected if key[0] != name}
        self._preloaded = {key for key in self._preloaded if key[0] != name}
        log.info("adapter.deleted name=%s rev=%d", name, served)
        await self._report(Report(name, served, ReportKind.REMOVED, 0))

    def _serving_revision(self, name: str) -> int:
        return self._registry.current_revision(name) or 0

    async def _keep_alive(self) -> None:
        """Signs of life keep this replica's statuses shown in the store; when the
        store had let them expire, every adapter's latest report goes again."""
        while True:
            try:
                known = await self._store.alive()
                if not known:
                    for report in list(self._latest.values()):
                        await self._report(report)
            except errors.LoraserveError as exc:
                log.warning("sync.alive_failed reason=%s", exc)
            except Exception:
                # A bug here must not silently end the signs of life.
                log.exception("sync.alive_bug")
            await asyncio.sleep(self._settings.status_interval_s)

    async def _report(self, report: Report) -> None:
        if report.kind is ReportKind.REMOVED:
            self._latest.pop(report.name, None)
        else:
            self._latest[report.name] = report
        try:
            await self._store.report(report)
        except TRANSIENT_ERRORS as exc:
            # The store keeps one status per replica and adapter: the latest report
            # is all that needs to reach it, once it is back.
            log.warning(
                "sync.report_deferred name=%s rev=%d type=%s reason=%s",
                report.name,
                report.revision,
                report.kind.name,
                exc,
            )
            self._unsent[report.name] = report
        except errors.LoraserveError as exc:
            log.error(
                "sync.report_refused name=%s rev=%d type=%s reason=%s",
                report.name,
                report.revision,
                report.kind.name,
                exc,
            )
            self._unsent.pop(report.name, None)
        else:
            self._unsent.pop(report.name, None)

    async def _resend_reports(self) -> None:
        for report in list(self._unsent.values()):
            if self._unsent.get(report.name) is report:
                await self._report(report)

    def _note_progress(self) -> None:
        if (
            self._initial_seq is not None
            and not self.initial_sync_done.is_set()
            and self.applied_seq >= self._initial_seq
        ):
            log.info("sync.initial_done seq=%d", self._initial_seq)
            self.initial_sync_done.set()

    def _backoff(self) -> Backoff:
        return Backoff(self._settings.initial_backoff_s, self._settings.max_backoff_s)


class _MissedEvents(Exception):
    """The watch skipped seqs; only a fresh listing can say what changed."""


async def current_adapter_ranks(
    store: StoreAPI, served_model_name: str, *, require_base_model_match: bool = True
) -> list[int]:
    """LoRA ranks of every current adapter this server would serve, for
    `--max-lora-rank auto`. Filtered here, with the compatibility check's own rule:
    adapters name their base model by path or hub id, which the store's exact-match
    filter would miss."""
    listing = await store.list_adapters()
    return [
        a.current.rank
        for a in listing.adapters
        if a.current is not None
        and serves_base_model(
            a.current.base_model, served_model_name, require_match=require_base_model_match
        )
    ]
