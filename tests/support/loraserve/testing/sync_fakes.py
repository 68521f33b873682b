"""Fakes of the store, the fetcher and the registry for the synchronizer's unit tests.

The store's watch streams are fed by the test; the harness runs a `Synchronizer` on the three.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loraserve.clients.store import (
    EventKind,
    Heartbeat,
    ListedAdapter,
    Listing,
    Report,
    ReportKind,
    StoreEvent,
)
from loraserve.common.errors import TRANSIENT_ERRORS, LoraserveError
from loraserve.common.manifest import FileInfo, Revision
from loraserve.inference.adapters import RegistryCounts
from loraserve.inference.cache import CachedRevision
from loraserve.inference.sync import Synchronizer, SyncSettings
from loraserve.testing.waiting import eventually

FAST = SyncSettings(initial_backoff_s=0.001, max_backoff_s=0.01)
_END = object()  # ends a fake watch stream normally


def manifest(name: str, revision: int, rank: int = 8, seq: int = 0) -> Revision:
    return Revision(
        adapter_name=name,
        revision=revision,
        files=(FileInfo("adapter_model.safetensors", 10, "0" * 64),),
        base_model="tiny",
        rank=rank,
        alpha=16.0,
        target_modules=("q_proj",),
        create_time=datetime(2026, 1, 1, tzinfo=UTC),
        pushed_by="test",
        description="",
        seq=seq,
    )


def pushed(seq: int, name: str, revision: int, *, promote: bool = True) -> StoreEvent:
    return StoreEvent(
        seq,
        EventKind.REVISION_PUSHED,
        name,
        manifest(name, revision),
        revision if promote else revision - 1,
    )


def current_set(seq: int, name: str, revision: int) -> StoreEvent:
    return StoreEvent(seq, EventKind.CURRENT_REVISION_SET, name, manifest(name, revision), revision)


def deleted(seq: int, name: str) -> StoreEvent:
    return StoreEvent(seq, EventKind.ADAPTER_DELETED, name, None, 0)


class FakeStore:
    """A store whose watch streams are fed by the test, one queue per stream."""

    def __init__(self, listing: Listing) -> None:
        self.listings = [listing]
        self.list_calls = 0
        self.watch_calls: list[int] = []
        self.watch_incarnations: list[str] = []
        self.streams: asyncio.Queue[asyncio.Queue[object]] = asyncio.Queue()
        self.reports: list[Report] = []
        self.report_failures: list[LoraserveError] = []
        self.alive_calls = 0
        # Answers of the next signs of life (then True): False says the store forgot us.
        self.known: list[bool] = []

    async def list_adapters(self, base_model: str = "") -> Listing:
        self.list_calls += 1
        listing = self.listings[min(self.list_calls, len(self.listings)) - 1]
        if base_model:
            adapters = tuple(
                a for a in listing.adapters if a.current and a.current.base_model == base_model
            )
            return Listing(adapters, listing.seq, listing.incarnation)
        return listing

    async def watch(
        self, after_seq: int, incarnation: str = ""
    ) -> AsyncGenerator[StoreEvent | Heartbeat, None]:
        self.watch_calls.append(after_seq)
        self.watch_incarnations.append(incarnation)
        stream = await self.streams.get()
        while True:
            item = await stream.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, StoreEvent | Heartbeat)
            yield item

    def open_stream(self, *items: object) -> asyncio.Queue[object]:
        stream: asyncio.Queue[object] = asyncio.Queue()
        for item in items:
            stream.put_nowait(item)
        self.streams.put_nowait(stream)
        return stream

    async def report(self, report: Report) -> None:
        if self.report_failures:
            raise self.report_failures.pop(0)
        self.reports.append(report)

    async def alive(self) -> bool:
        self.alive_calls += 1
        return self.known.pop(0) if self.known else True

    def reports_of(self, kind: ReportKind) -> list[tuple[str, int]]:
        return [(r.name, r.revision) for r in self.reports if r.kind is kind]


class FakeFetcher:
    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.given: list[Revision | None] = []
        self.failures: dict[tuple[str, int], list[Exception]] = {}
        self.gates: dict[tuple[str, int], asyncio.Event] = {}

    async def fetch(
        self, name: str, revision: int, given: Revision | None = None
    ) -> CachedRevision:
        self.calls.append((name, revision))
        self.given.append(given)
        gate = self.gates.get((name, revision))
        if gate is not None:
            await gate.wait()
        failures = self.failures.get((name, revision))
        if failures:
            raise failures.pop(0)
        return CachedRevision(
            given or manifest(name, revision), Path("/cache") / name / str(revision)
        )


class FakeRegistry:
    """Records what sync asks of it; fetches through `fetcher` as the registry fetches
    through the cache, listing a fetch that failed for good as the registry does."""

    def __init__(self) -> None:
        self.fetcher = FakeFetcher()
        self.installed: set[tuple[str, int]] = set()
        self.current: dict[str, int] = {}
        self.installs: list[tuple[str, int, bool]] = []
        self.set_currents: list[tuple[str, int]] = []
        self.deletes: list[str] = []
        self.install_failures: dict[tuple[str, int], Exception] = {}
        self.failures: dict[tuple[str, int], str] = {}
        # Names routed without loading (set_target).
        self.targets: dict[str, int] = {}
        # The manifest of every revision installed or targeted, for `held`.
        self.manifests: dict[tuple[str, int], Revision] = {}

    async def install(self, manifest: Revision, *, make_current: bool) -> None:
        key = manifest.key
        try:
            await self.fetcher.fetch(*key, manifest)
        except TRANSIENT_ERRORS:
            raise
        except LoraserveError as exc:
            self.failures[key] = exc.message
            raise
        self.installs.append((*key, make_current))
        if key in self.install_failures:
            raise self.install_failures[key]
        self.installed.add(key)
        self.manifests[key] = manifest
        if make_current:
            self._flip(*key)

    async def set_current(self, name: str, revision: int) -> None:
        assert (name, revision) in self.installed
        self.set_currents.append((name, revision))
        self._flip(name, revision)

    def _flip(self, name: str, revision: int) -> None:
        # Like the real registry, the previous current revision retires.
        old = self.current.get(name)
        self.current[name] = revision
        if old is not None and old != revision:
            self.installed.discard((name, old))

    async def delete(self, name: str) -> None:
        self.deletes.append(name)
        self.targets.pop(name, None)
        self.installed = {key for key in self.installed if key[0] != name}
        self.manifests = {key: m for key, m in self.manifests.items() if key[0] != name}
        self.current.pop(name, None)

    def held(self) -> dict[str, int]:
        oldest: dict[str, int] = {}
        for (name, _), held in self.manifests.items():
            oldest[name] = min(oldest.get(name, held.seq), held.seq)
        return oldest

    def current_revision(self, name: str) -> int | None:
        return self.current.get(name)

    def is_loaded(self, name: str, revision: int) -> bool:
        return (name, revision) in self.installed

    def uses_files(self, name: str, revision: int) -> bool:
        return (name, revision) in self.installed

    def set_target(self, manifest: Revision) -> None:
        self.targets[manifest.adapter_name] = manifest.revision
        self.manifests[(manifest.adapter_name, manifest.revision)] = manifest

    def target_revision(self, name: str) -> int | None:
        return self.targets.get(name, self.current.get(name))

    def is_resident(self, name: str) -> bool:
        return name in self.current

    def counts(self) -> RegistryCounts:
        return RegistryCounts(
            routed=len(self.targets | self.current),
            resident=len(self.current),
            loaded=len(self.installed),
            in_slots=0,
        )


class FakeDiskCache:
    """Sync's view of the disk cache: no files; `recent` names the adapters served most
    recently."""

    def __init__(self, recent: Callable[[], list[str]] | None = None) -> None:
        self._recent = recent or list

    async def sweep(self, keep: Callable[[str, int], bool]) -> None:
        pass

    def recent_names(self) -> list[str]:
        return self._recent()


def listing(seq: int, *revisions: tuple[str, int]) -> Listing:
    return Listing(tuple(ListedAdapter(n, manifest(n, r)) for n, r in revisions), seq)


class Harness:
    def __init__(
        self,
        initial: Listing,
        settings: SyncSettings = FAST,
        recent_names: Callable[[], list[str]] | None = None,
    ) -> None:
        self.store = FakeStore(initial)
        self.registry = FakeRegistry()
        self.fetcher = self.registry.fetcher
        self.swaps: list[float] = []
        self.sync = Synchronizer(
            self.store,
            self.registry,
            FakeDiskCache(recent_names),
            settings,
            observe_swap=self.swaps.append,
        )

    async def started(self) -> None:
        await asyncio.wait_for(self.sync.initial_sync_done.wait(), 5)

    def feed(self, stream: asyncio.Queue[object], *items: object) -> None:
        for item in items:
            stream.put_nowait(item)

    async def settled(self, seq: int) -> None:
        await eventually(lambda: self.sync.applied_seq >= seq, f"applied seq {seq}")


@asynccontextmanager
async def running(harness: Harness) -> AsyncIterator[Harness]:
    task = asyncio.create_task(harness.sync.run())
    try:
        yield harness
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
