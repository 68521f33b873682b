"""Fakes of the fetcher and the registry for the synchronizer's unit tests, and the
harness that runs a `Synchronizer` on them and a FakeStore (sync_store.py), whose
watch streams are fed by the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from loraserve.clients.store import (
    Listing,
    RolloutSplit,
)
from loraserve.common.errors import (
    TRANSIENT_ERRORS,
    FailedPrecondition,
    LoraserveError,
    rpc_code,
)
from loraserve.common.fleet.reports import (
    AdapterReport,
    ReplicaError,
    RevisionReport,
    ServingState,
)
from loraserve.common.revisions.manifest import Revision
from loraserve.inference.adapters import RegistryCounts
from loraserve.inference.cache import CachedRevision
from loraserve.inference.sync import ReportSettings, Synchronizer, SyncSettings
from loraserve.testing.fakes.sync_store import FakeStore, manifest
from loraserve.testing.waiting import eventually

FAST = SyncSettings(
    initial_backoff_s=0.001,
    max_backoff_s=0.01,
    reports=ReportSettings(interval_s=60.0, flush_s=0.005, counters_interval_s=0.005),
)


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
        # Revisions listed FAILED: (code, message).
        self.failures: dict[tuple[str, int], tuple[int, str]] = {}
        self.splits: dict[str, RolloutSplit] = {}
        # Names whose report changed, as the registry's on_change tells sync.
        self.changed: set[str] = set()
        self.candidates_installed: list[tuple[str, int]] = []
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
            self.mark_failed(manifest, exc)
            raise
        self.installs.append((*key, make_current))
        if key in self.install_failures:
            failure = self.install_failures[key]
            if isinstance(failure, LoraserveError) and not isinstance(failure, TRANSIENT_ERRORS):
                self.mark_failed(manifest, failure)
            raise failure
        self.failures.pop(key, None)
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
        self.splits.pop(name, None)
        self.failures = {key: f for key, f in self.failures.items() if key[0] != name}
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
        if manifest.rank > 16:
            error = FailedPrecondition(f"rank {manifest.rank} exceeds --max-lora-rank 16")
            self.mark_failed(manifest, error)
            raise error
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

    def mark_failed(self, manifest: Revision, error: Exception) -> None:
        message = error.message if isinstance(error, LoraserveError) else type(error).__name__
        self.failures[manifest.key] = (rpc_code(error), message)

    def set_rollout(self, name: str, split: RolloutSplit) -> None:
        self.splits[name] = split
        if split.candidate.rank > 16:
            error = FailedPrecondition(f"rank {split.candidate.rank} exceeds --max-lora-rank 16")
            self.mark_failed(split.candidate, error)
            raise error

    def end_rollout(self, name: str) -> None:
        self.splits.pop(name, None)
        self.changed.add(name)

    async def install_candidate(self, name: str) -> None:
        split = self.splits[name]
        await self.fetcher.fetch(*split.candidate.key, split.candidate)
        self.candidates_installed.append(split.candidate.key)
        self.installed.add(split.candidate.key)

    def split_of(self, name: str) -> RolloutSplit | None:
        return self.splits.get(name)

    def names(self) -> set[str]:
        failed = {name for name, _ in self.failures}
        return set(self.current) | set(self.targets) | set(self.splits) | failed

    def report(self, name: str) -> AdapterReport | None:
        """As the registry reports: what the name routes, loaded or not, its candidate,
        and what failed."""
        revisions: dict[int, RevisionReport] = {}
        serving = self.current.get(name) or self.targets.get(name, 0)
        if serving:
            loaded = (name, serving) in self.installed
            state = ServingState.LOADED if loaded else ServingState.ROUTED
            revisions[serving] = RevisionReport(serving, state)
        split = self.splits.get(name)
        if split is not None:
            number = split.candidate.revision
            loaded = (name, number) in self.installed
            state = ServingState.LOADED if loaded else ServingState.ROUTED
            revisions[number] = RevisionReport(number, state, candidate=True)
        for (failed_name, number), (code, message) in self.failures.items():
            if failed_name == name:
                candidate = split is not None and split.candidate.revision == number
                error = ReplicaError(code, message)
                revisions[number] = RevisionReport(number, ServingState.FAILED, error, candidate)
        if not revisions:
            return None
        return AdapterReport(name, serving, tuple(revisions[n] for n in sorted(revisions)))


class FakeDiskCache:
    """Sync's view of the disk cache: no files; `recent` names the adapters served most
    recently."""

    def __init__(self, recent: Callable[[], list[str]] | None = None) -> None:
        self._recent = recent or list

    async def sweep(self, keep: Callable[[str, int], bool]) -> None:
        pass

    def recent_names(self) -> list[str]:
        return self._recent()


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
            changed=self.registry.changed,
        )

    async def started(self) -> None:
        await asyncio.wait_for(self.sync.initial_sync_done.wait(), 5)

    def feed(self, stream: asyncio.Queue[object], *items: object) -> None:
        for item in items:
            stream.put_nowait(item)

    async def settled(self, seq: int) -> None:
        await eventually(lambda: self.sync.applied_seq >= seq, f"applied seq {seq}")

    async def reported(
        self, name: str, expected: tuple[int, dict[int, ServingState]] | None
    ) -> None:
        """Waits until the store holds `expected` (see FakeStore.routes) of `name`."""
        await eventually(
            lambda: self.store.routes(name) == expected, f"{name} reported as {expected}"
        )


@asynccontextmanager
async def running(harness: Harness) -> AsyncIterator[Harness]:
    task = asyncio.create_task(harness.sync.run())
    try:
        yield harness
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
