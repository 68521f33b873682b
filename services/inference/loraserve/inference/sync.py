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
serving. Loading and its ACK/NACK are `revisionloads`; delivering reports is
`statusreports`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from loraserve.clients.store import Heartbeat, Listing, StoreEvent
from loraserve.common import errors
from loraserve.common.backoff import Backoff
from loraserve.common.errors import TRANSIENT_ERRORS
from loraserve.inference.compat import serves_base_model
from loraserve.inference.revisionloads import Fetcher, Registry, RevisionLoader, SwapObserver
from loraserve.inference.statusreports import StatusAPI, StatusReporter
from loraserve.inference.syncstate import AdapterWish, SyncState

log = logging.getLogger(__name__)


class StoreAPI(StatusAPI, Protocol):
    """The calls the synchronizer makes to the store (`StoreClient`, or a fake)."""

    async def list_adapters(self, base_model: str = "") -> Listing: ...

    def watch(self, after_seq: int) -> AsyncGenerator[StoreEvent | Heartbeat, None]: ...


class Sweeper(Protocol):
    """Removes cached revisions nothing needs (`AdapterCache`)."""

    async def sweep(self, keep: Callable[[str, int], bool]) -> None: ...


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
        self._registry = registry
        self._settings = settings or SyncSettings()
        self._state = SyncState()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._reports = StatusReporter(store, self._settings.status_interval_s)
        self._loader = RevisionLoader(
            fetcher,
            registry,
            self._reports,
            self._settings.max_concurrent_loads,
            observe_swap,
        )
        self._initial_seq: int | None = None
        self.initial_sync_done = asyncio.Event()

    @property
    def applied_seq(self) -> int:
        """Every change up to this seq is applied (or rejected)."""
        return self._state.applied_seq()

    async def run(self) -> None:
        keep_alive = asyncio.create_task(self._reports.keep_alive(), name="sync:alive")
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
                            await self._reports.resend_unsent()
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
        served = self._loader.served | {
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
            self._loader.ask_again(event.name, event.revision.revision)
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
            await self._loader.delete(name)
            if wish.delete_seq == delete_seq:
                wish.delete_seq = 0
        target = wish.current
        if target is not None and self._loader.wants(target):
            await self._loader.serve(target, make_current=True, seen_at=wish.current_seen_at)
        for revision, manifest in sorted(wish.preload.items()):
            await self._loader.preload(manifest)
            wish.preload.pop(revision, None)

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
