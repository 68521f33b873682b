"""The store as the synchronizer's unit tests see it: events and listings built by the
test, watch streams it feeds, and the status batches a replica sends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from datetime import UTC, datetime

from loraserve.clients.replicareport import StatusBatch
from loraserve.clients.store import (
    EventKind,
    Heartbeat,
    ListedAdapter,
    Listing,
    RolloutSplit,
    StoreEvent,
)
from loraserve.common.errors import LoraserveError
from loraserve.common.fleet.reports import AdapterReport, ServingState
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.statusshards import shard_of

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


def rollout(
    seq: int, name: str, candidate: int, current: int, weight: float | None, start_seq: int = 0
) -> StoreEvent:
    """A rollout event: `weight` percent to `candidate` (None: the rollout ended, the
    current revision being `current` after it)."""
    split = None
    if weight is not None:
        split = RolloutSplit(manifest(name, candidate), weight, start_seq or seq)
    return StoreEvent(
        seq, EventKind.ROLLOUT_CHANGED, name, manifest(name, candidate), current, split
    )


class FakeStore:
    """A store whose watch streams are fed by the test, one queue per stream."""

    def __init__(self, listing: Listing) -> None:
        self.listings = [listing]
        self.list_calls = 0
        self.watch_calls: list[int] = []
        self.watch_incarnations: list[str] = []
        self.streams: asyncio.Queue[asyncio.Queue[object]] = asyncio.Queue()
        self.batches: list[StatusBatch] = []
        # What the store holds: per shard, the adapters' reports of its latest batch.
        self.shards: dict[int, tuple[AdapterReport, ...]] = {}
        self.report_failures: list[LoraserveError] = []
        # Answers of the next reports (then True): False says the store forgot us.
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

    async def report_status(self, batch: StatusBatch) -> bool:
        if self.report_failures:
            raise self.report_failures.pop(0)
        self.batches.append(batch)
        self.shards.update(batch.shards)
        return self.known.pop(0) if self.known else True

    def reported(self, name: str) -> AdapterReport | None:
        """What the store holds of the adapter from this replica."""
        return next((a for a in self.shards.get(shard_of(name), ()) if a.name == name), None)

    def routes(self, name: str) -> tuple[int, dict[int, ServingState]] | None:
        """What the store holds of the adapter from this replica: its serving revision
        and each revision's state; None when the replica reports none of it."""
        report = self.reported(name)
        if report is None:
            return None
        return report.serving_revision, {r.revision: r.state for r in report.revisions}

    def state_of(self, name: str, revision: int) -> ServingState | None:
        report = self.reported(name)
        found = (
            next((r for r in report.revisions if r.revision == revision), None) if report else None
        )
        return found.state if found else None

    def failure_of(self, name: str, revision: int) -> tuple[int, str] | None:
        """The code and reason of a revision reported FAILED; None when it is not."""
        report = self.reported(name)
        for r in report.revisions if report else ():
            if r.revision == revision and r.state is ServingState.FAILED and r.error is not None:
                return r.error.code, r.error.message
        return None


def listing(seq: int, *revisions: tuple[str, int]) -> Listing:
    return Listing(tuple(ListedAdapter(n, manifest(n, r)) for n, r in revisions), seq)
