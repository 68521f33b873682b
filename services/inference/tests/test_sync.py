"""The synchronizer's logic against fakes of the store, the fetcher and the registry.

The end-to-end behaviour (real store, real engine) is in tests/test_hot_swap.py;
these pin down ordering, retries, coalescing and reconnects quickly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
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
from loraserve.common.errors import (
    DataLoss,
    FailedPrecondition,
    LoraserveError,
    NotFound,
    OutOfRange,
    Unavailable,
)
from loraserve.common.manifest import FileInfo, Revision
from loraserve.inference.cache import CachedRevision
from loraserve.inference.sync import Synchronizer, SyncSettings, current_adapter_ranks
from loraserve.testing.waiting import eventually

FAST = SyncSettings(initial_backoff_s=0.001, max_backoff_s=0.01)
_END = object()  # ends a fake watch stream normally


def manifest(name: str, revision: int, rank: int = 8) -> Revision:
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
        seq=0,
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
            return Listing(adapters, listing.seq)
        return listing

    async def watch(self, after_seq: int) -> AsyncGenerator[StoreEvent | Heartbeat, None]:
        self.watch_calls.append(after_seq)
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
    def __init__(self) -> None:
        self.installed: set[tuple[str, int]] = set()
        self.current: dict[str, int] = {}
        self.installs: list[tuple[str, int, bool]] = []
        self.set_currents: list[tuple[str, int]] = []
        self.deletes: list[str] = []
        self.install_failures: dict[tuple[str, int], Exception] = {}
        self.failures: dict[tuple[str, int], str] = {}

    async def install(self, rev: CachedRevision, *, make_current: bool) -> None:
        key = (rev.name, rev.revision)
        self.installs.append((rev.name, rev.revision, make_current))
        if key in self.install_failures:
            raise self.install_failures[key]
        self.installed.add(key)
        if make_current:
            self._flip(rev.name, rev.revision)

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
        self.installed = {key for key in self.installed if key[0] != name}
        self.current.pop(name, None)

    def current_revision(self, name: str) -> int | None:
        return self.current.get(name)

    def is_installed(self, name: str, revision: int) -> bool:
        return (name, revision) in self.installed

    def holds(self, name: str, revision: int) -> bool:
        return (name, revision) in self.installed

    def record_failure(self, given: Revision, message: str) -> None:
        self.failures[(given.adapter_name, given.revision)] = message


def listing(seq: int, *revisions: tuple[str, int]) -> Listing:
    return Listing(tuple(ListedAdapter(n, manifest(n, r)) for n, r in revisions), seq)


class Harness:
    def __init__(self, initial: Listing) -> None:
        self.store = FakeStore(initial)
        self.fetcher = FakeFetcher()
        self.registry = FakeRegistry()
        self.swaps: list[float] = []
        self.sync = Synchronizer(
            self.store,
            self.fetcher,
            self.registry,
            FAST,
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


async def test_start_up_installs_each_current_revision_acks_and_watches_from_listing_seq() -> None:
    h = Harness(listing(7, ("a", 2), ("b", 1)))
    h.store.open_stream()
    async with running(h):
        await asyncio.wait_for(h.sync.initial_sync_done.wait(), 5)
        assert h.registry.current == {"a": 2, "b": 1}
        assert sorted(h.store.reports_of(ReportKind.ACK)) == [("a", 2), ("b", 1)]
        await eventually(lambda: h.store.watch_calls == [7], "watch from 7")
        assert h.sync.applied_seq == 7


async def test_initial_sync_done_waits_for_every_listed_adapter() -> None:
    h = Harness(listing(3, ("a", 1)))
    h.fetcher.gates[("a", 1)] = gate = asyncio.Event()
    h.store.open_stream()
    async with running(h):
        await eventually(lambda: h.fetcher.calls == [("a", 1)], "fetch started")
        assert not h.sync.initial_sync_done.is_set()
        gate.set()
        await asyncio.wait_for(h.sync.initial_sync_done.wait(), 5)


async def test_pushed_current_revision_is_installed_routed_acked_and_timed() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.registry.installs[-1] == ("a", 2, True)
        assert h.registry.current["a"] == 2
        assert h.store.reports[-1] == Report("a", 2, ReportKind.ACK, 2)
        assert len(h.swaps) == 1


async def test_loads_hand_the_listed_and_pushed_manifests_to_the_fetcher() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.fetcher.given == [manifest("a", 1), manifest("a", 2)]


def slow_retries(h: Harness) -> None:
    h.sync = Synchronizer(
        h.store, h.fetcher, h.registry, SyncSettings(initial_backoff_s=600, max_backoff_s=600)
    )


async def test_a_newer_event_cuts_the_wait_before_a_retry_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(listing(1, ("a", 1)))
    slow_retries(h)
    h.fetcher.failures[("a", 2)] = [Unavailable("engine busy")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await eventually(lambda: "sync.apply_retry name=a" in caplog.text, "a@2 waits to retry")
        h.feed(stream, pushed(3, "a", 3))
        await h.settled(3)
        assert h.registry.current["a"] == 3


async def test_an_event_during_a_failing_load_is_applied_without_waiting() -> None:
    h = Harness(listing(1, ("a", 1)))
    slow_retries(h)
    h.fetcher.failures[("a", 2)] = [Unavailable("engine busy")]
    h.fetcher.gates[("a", 2)] = gate = asyncio.Event()
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await eventually(lambda: ("a", 2) in h.fetcher.calls, "fetch of a@2 started")
        h.feed(stream, pushed(3, "a", 3))
        await eventually(lambda: stream.empty(), "event taken in")
        gate.set()
        await h.settled(3)
        assert h.registry.current["a"] == 3


async def test_pushed_revision_not_promoted_is_loaded_without_routing() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False))
        await h.settled(2)
        assert h.registry.installs[-1] == ("a", 2, False)
        assert h.registry.current["a"] == 1
        assert h.store.reports[-1] == Report("a", 2, ReportKind.ACK, 1)


async def test_rollback_to_an_installed_revision_only_moves_the_route() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False))
        await h.settled(2)
        h.feed(stream, current_set(3, "a", 2))
        await h.settled(3)
        assert h.registry.set_currents == [("a", 2)]
        assert h.fetcher.calls == [("a", 1), ("a", 2)]
        assert h.store.reports[-1] == Report("a", 2, ReportKind.ACK, 2)


async def test_rollback_to_a_retired_revision_fetches_and_installs_it_again() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        h.feed(stream, current_set(3, "a", 1))
        await h.settled(3)
        assert h.registry.current["a"] == 1
        assert h.registry.installs[-1] == ("a", 1, True)


async def test_delete_unroutes_the_adapter_and_reports_removed() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, deleted(2, "a"))
        await h.settled(2)
        assert h.registry.deletes == ["a"]
        assert h.store.reports[-1] == Report("a", 1, ReportKind.REMOVED, 0)


async def test_incompatible_revision_is_nacked_once_with_its_reason_and_old_keeps_serving() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.registry.install_failures[("a", 2)] = FailedPrecondition("rank 64 above max_lora_rank 16")
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2), Heartbeat(2))
        await h.settled(2)
        nack = h.store.reports[-1]
        assert (nack.kind, nack.revision, nack.serving_revision) == (ReportKind.NACK, 2, 1)
        assert (nack.error_code, nack.error_message) == (9, "rank 64 above max_lora_rank 16")
        assert h.registry.current["a"] == 1
        assert h.registry.installs.count(("a", 2, True)) == 1


async def test_corrupt_download_is_nacked_with_data_loss() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [DataLoss("sha256 mismatch")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.store.reports[-1].error_code == 15
        assert h.registry.current["a"] == 1


async def test_unexpected_load_error_is_nacked_as_internal_and_sync_goes_on() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.registry.install_failures[("a", 2)] = RuntimeError("engine said no")
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2), pushed(3, "b", 1))
        await h.settled(3)
        assert h.store.reports_of(ReportKind.NACK) == [("a", 2)]
        assert [r.error_code for r in h.store.reports if r.kind is ReportKind.NACK] == [13]
        assert h.registry.current == {"a": 1, "b": 1}


async def test_transient_fetch_failure_is_retried_until_it_loads() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [Unavailable("store down"), Unavailable("store down")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.fetcher.calls.count(("a", 2)) == 3
        assert h.registry.installs.count(("a", 2, True)) == 1
        assert h.store.reports_of(ReportKind.NACK) == []


async def test_events_queued_behind_a_slow_load_fold_into_the_latest_current_revision() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.gates[("a", 2)] = gate = asyncio.Event()
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await eventually(lambda: ("a", 2) in h.fetcher.calls, "fetch of a@2 started")
        for event in (pushed(3, "a", 3), pushed(4, "a", 4), pushed(5, "a", 5)):
            stream.put_nowait(event)
        await eventually(lambda: stream.empty(), "events taken in")
        gate.set()
        await h.settled(5)
        assert h.fetcher.calls == [("a", 1), ("a", 2), ("a", 5)]
        assert h.registry.current["a"] == 5


async def test_watch_reconnects_after_the_last_received_seq_and_applies_nothing_twice() -> None:
    h = Harness(listing(1, ("a", 1)))
    first = h.store.open_stream()
    # The store may replay from its own position; events already taken are skipped.
    h.store.open_stream(pushed(2, "a", 2), pushed(3, "a", 3))
    async with running(h):
        await h.started()
        h.feed(first, pushed(2, "a", 2), Unavailable("connection reset"))
        await h.settled(3)
        assert h.store.watch_calls[:2] == [1, 2]
        assert h.registry.installs == [("a", 1, True), ("a", 2, True), ("a", 3, True)]


async def test_watch_out_of_range_lists_again_and_reconciles() -> None:
    h = Harness(listing(1, ("a", 1), ("b", 1)))
    h.store.listings.append(listing(9, ("a", 3), ("c", 1)))
    h.store.open_stream(OutOfRange("after_seq 1 is older than the kept log"))
    h.store.open_stream()
    async with running(h):
        await h.settled(9)
        assert h.registry.current == {"a": 3, "c": 1}
        assert h.registry.deletes == ["b"]
        await eventually(lambda: h.store.watch_calls == [1, 9], "watch from 9")


async def test_relist_where_an_adapter_has_no_current_revision_unroutes_it() -> None:
    # Deleted, then pushed again unpromoted, while this replica was behind.
    h = Harness(listing(1, ("a", 1), ("b", 1)))
    h.store.listings.append(
        Listing((ListedAdapter("a", None), ListedAdapter("b", manifest("b", 1))), 9)
    )
    h.store.open_stream(OutOfRange("after_seq 1 is older than the kept log"))
    h.store.open_stream()
    async with running(h):
        await h.settled(9)
        assert h.registry.deletes == ["a"]
        assert h.registry.current == {"b": 1}


async def test_a_hole_in_the_event_seqs_lists_again() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.store.listings.append(listing(5, ("a", 4)))
    h.store.open_stream(pushed(5, "a", 4))
    h.store.open_stream()
    async with running(h):
        await h.settled(5)
        assert h.store.list_calls == 2
        assert h.registry.current["a"] == 4


async def test_report_that_fails_is_sent_again_after_reconnecting() -> None:
    h = Harness(listing(1))
    first = h.store.open_stream()
    h.store.open_stream(Heartbeat(2))
    async with running(h):
        await h.started()
        h.store.report_failures.append(Unavailable("store down"))
        h.feed(first, pushed(2, "a", 1))
        await h.settled(2)
        assert h.store.reports == []
        h.feed(first, Unavailable("connection reset"))
        await eventually(lambda: h.store.reports_of(ReportKind.ACK) == [("a", 1)], "ACK resent")


async def test_replica_reports_its_adapters_again_when_the_store_forgot_its_statuses() -> None:
    h = Harness(listing(1, ("a", 1), ("b", 2)))
    h.sync = Synchronizer(h.store, h.fetcher, h.registry, replace(FAST, status_interval_s=0.001))
    h.store.open_stream()
    async with running(h):
        await h.started()
        await eventually(lambda: len(h.store.reports) == 2, "first ACKs")
        h.store.known = [False]
        await eventually(lambda: len(h.store.reports) == 4, "ACKs sent again")
    assert sorted(h.store.reports_of(ReportKind.ACK)) == [("a", 1), ("a", 1), ("b", 2), ("b", 2)]


async def test_store_down_at_start_up_is_retried_until_it_lists() -> None:
    h = Harness(listing(4, ("a", 1)))
    failures = [Unavailable("down"), Unavailable("down")]
    real_list = h.store.list_adapters

    async def flaky_list(base_model: str = "") -> Listing:
        if failures:
            raise failures.pop(0)
        return await real_list(base_model)

    h.store.list_adapters = flaky_list  # type: ignore[method-assign]
    h.store.open_stream()
    async with running(h):
        await asyncio.wait_for(h.sync.initial_sync_done.wait(), 5)
        assert h.registry.current == {"a": 1}


async def test_deleted_then_pushed_again_drops_old_revisions_first() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.gates[("a", 1)] = gate = asyncio.Event()
    stream = h.store.open_stream()
    async with running(h):
        await eventually(lambda: ("a", 1) in h.fetcher.calls, "initial fetch started")
        stream.put_nowait(deleted(2, "a"))
        stream.put_nowait(pushed(3, "a", 2))
        await eventually(lambda: stream.empty(), "events taken in")
        gate.set()
        await h.settled(3)
        assert h.registry.deletes == ["a"]
        assert h.registry.current == {"a": 2}


async def test_max_lora_rank_auto_sees_the_rank_of_every_current_adapter() -> None:
    store = FakeStore(
        Listing(
            (
                ListedAdapter("a", manifest("a", 1, rank=8)),
                ListedAdapter("b", manifest("b", 3, rank=64)),
                ListedAdapter("c", None),
            ),
            5,
        )
    )
    assert sorted(await current_adapter_ranks(store, "tiny")) == [8, 64]


async def test_max_lora_rank_auto_matches_base_models_as_the_compatibility_check_does() -> None:
    def trained_on(name: str, rank: int, base_model: str) -> ListedAdapter:
        return ListedAdapter(name, replace(manifest(name, 1, rank=rank), base_model=base_model))

    store = FakeStore(
        Listing(
            (
                trained_on("by-path", 32, "/models/tiny"),
                trained_on("by-hub-id", 16, "org/tiny/"),
                trained_on("unnamed", 8, ""),
                trained_on("other-model", 64, "org/other"),
            ),
            5,
        )
    )
    assert sorted(await current_adapter_ranks(store, "tiny")) == [8, 16, 32]
    assert sorted(await current_adapter_ranks(store, "tiny", require_base_model_match=False)) == [
        8,
        16,
        32,
        64,
    ]


async def test_revision_refused_before_the_registry_saw_it_is_listed_as_failed() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [FailedPrecondition("adapter a@2 has LoRA rank 64")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.registry.failures == {("a", 2): "adapter a@2 has LoRA rank 64"}
        assert h.store.reports_of(ReportKind.NACK) == [("a", 2)]


async def test_unknown_revision_is_nacked_not_found() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [NotFound("no revision a@2")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.store.reports[-1].error_code == 5
