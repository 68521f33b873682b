"""What a push, a listing page, a snapshot and a restart cost the store: no more with
twice the adapters. Counted in S3 requests (moto over HTTP, through the fault proxy)
or in work done, never in time."""

from __future__ import annotations

import asyncio
import re
from dataclasses import replace
from typing import Any

import pytest

from loraserve.adapterstore.blobs.s3blobs import S3BlobStore
from loraserve.adapterstore.catalog.listing import adapter_page
from loraserve.adapterstore.catalog.model import Adapter, Change, ChangeType, StoreState, now
from loraserve.adapterstore.changelog import logstorage
from loraserve.adapterstore.changelog.log import LogSettings
from loraserve.adapterstore.changelog.logstorage import log_key, snapshot_key
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.stores import StoreFactory, s3_location
from loraserve.testing.waiting import GUARD_S, eventually

SMALL, LARGE = 20, 40
# The poller stays asleep while requests are counted.
QUIET_LOG = LogSettings(poll_interval=600, snapshot_every=1000, log_retention=0)


def _proxied(bucket: S3Bucket, fault_proxy: S3FaultProxy, prefix: str = "") -> S3BlobStore:
    return S3BlobStore(s3_location(replace(bucket, endpoint_url=fault_proxy.endpoint_url), prefix))


async def _seed(store: AdapterStore, adapters: int) -> None:
    files = tiny_adapter()
    for first in range(0, adapters, 10):
        names = [f"a{i:05d}" for i in range(first, min(adapters, first + 10))]
        await asyncio.gather(*(push(store, name, files) for name in names))


def _stored(bucket: S3Bucket, key: str) -> bool:
    keys = bucket.keys()
    return key in keys


def _shapes(requests: list[tuple[str, str]], prefix: str) -> list[tuple[str, str]]:
    """Requests with the store's prefix, seqs, ids and digests taken out, sorted."""
    return sorted(
        (m, re.sub(r"[0-9a-f]{16,}|\d+", "N", k.removeprefix(prefix))) for m, k in requests
    )


async def test_a_push_makes_the_same_s3_requests_with_twice_the_adapters(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy, open_store: StoreFactory
) -> None:
    shapes = []
    for adapters in (SMALL, LARGE):
        prefix = f"n{adapters}/"
        store = await open_store(_proxied(s3_bucket, fault_proxy, prefix), QUIET_LOG)
        await _seed(store, adapters)
        before = len(fault_proxy.requests)
        await push(store, "a00001", tiny_adapter(seed=1))
        shapes.append(_shapes(fault_proxy.requests[before:], prefix))
    assert shapes[0] == shapes[1]


async def test_a_commit_makes_no_listing(
    s3_bucket: S3Bucket,
    fault_proxy: S3FaultProxy,
    open_store: StoreFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Past the store's first block of log entries, whose commits list the snapshots.
    monkeypatch.setattr(logstorage, "PRUNE_BLOCK", 10)
    store = await open_store(_proxied(s3_bucket, fault_proxy), QUIET_LOG)
    await _seed(store, SMALL)
    before = len(fault_proxy.listings)
    await push(store, "a00001", tiny_adapter(seed=1))
    await store.delete("a00002", "tester")
    assert fault_proxy.listings[before:] == []


class _DeleteRecordingBlobs(MemoryBlobStore):
    def __init__(self) -> None:
        super().__init__()
        self.deletes: list[list[str]] = []

    async def delete(self, keys: list[str]) -> None:
        self.deletes.append(list(keys))
        await super().delete(keys)


async def test_pruning_deletes_log_entries_by_block_oldest_first(
    open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logstorage, "PRUNE_BLOCK", 4)
    blobs = _DeleteRecordingBlobs()
    store = await open_store(blobs, replace(QUIET_LOG, snapshot_every=10, log_retention=5))
    await _seed(store, SMALL)
    await eventually(lambda: log_key(15) not in blobs.objects, "entries 1-15 pruned")
    entries = [keys for keys in blobs.deletes if any(k.startswith("log/") for k in keys)]
    blocks = [(1, 4), (5, 5), (6, 8), (9, 12), (13, 15)]
    assert entries == [[log_key(seq) for seq in range(a, b + 1)] for a, b in blocks]


async def test_a_push_returns_while_its_snapshot_is_still_being_written(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy, open_store: StoreFactory
) -> None:
    store = await open_store(
        _proxied(s3_bucket, fault_proxy), replace(QUIET_LOG, snapshot_every=1, log_retention=1)
    )
    held = fault_proxy.add(Fault.STALL, "PUT", "snapshots/")
    async with asyncio.timeout(GUARD_S):
        result = await push(store, "alpha", tiny_adapter())
        await held.hit.wait()
    assert result.seq == 1
    assert not _stored(s3_bucket, snapshot_key(1))
    fault_proxy.clear()
    fault_proxy.release()
    await eventually(lambda: _stored(s3_bucket, snapshot_key(1)), "snapshot 1 written")


async def test_pruning_reads_one_log_key_not_the_whole_log(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy, open_store: StoreFactory
) -> None:
    store = await open_store(
        _proxied(s3_bucket, fault_proxy), replace(QUIET_LOG, snapshot_every=10, log_retention=5)
    )
    await _seed(store, SMALL)
    await eventually(lambda: not _stored(s3_bucket, log_key(15)), "entries 1-15 pruned")
    log_listings = [q for q in fault_proxy.listings if q["prefix"] == "log/"]
    assert log_listings
    assert all(q.get("max-keys") == "1" for q in log_listings)
    assert _stored(s3_bucket, log_key(16))


async def test_a_restart_makes_the_same_s3_requests_with_twice_the_adapters(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy, open_store: StoreFactory
) -> None:
    settings = replace(QUIET_LOG, snapshot_every=10)
    shapes = []
    for adapters in (SMALL, LARGE):
        prefix = f"n{adapters}/"
        seeder = await open_store(_proxied(s3_bucket, fault_proxy, prefix), settings)
        await _seed(seeder, adapters + 3)
        await eventually(
            lambda p=prefix, a=adapters: _stored(s3_bucket, p + snapshot_key(a)),
            f"the snapshot at seq {adapters}",
        )
        before = len(fault_proxy.requests)
        restarted = await open_store(_proxied(s3_bucket, fault_proxy, prefix), settings)
        assert restarted.adapter_count == adapters + 3
        shapes.append(_shapes(fault_proxy.requests[before:], prefix))
    assert shapes[0] == shapes[1]


async def test_a_snapshot_encodes_only_the_adapters_changed_since_the_previous_one(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await open_store(memory_blobs, replace(QUIET_LOG, snapshot_every=10))
    await _seed(store, 50)
    await eventually(lambda: snapshot_key(50) in memory_blobs.objects, "snapshot 50 written")
    encoded: list[str] = []
    to_json = Adapter.to_json

    def counting(adapter: Adapter) -> dict[str, Any]:
        encoded.append(adapter.name)
        return to_json(adapter)

    monkeypatch.setattr(Adapter, "to_json", counting)
    for i in range(10):
        await push(store, f"a{i:05d}", tiny_adapter(seed=1))
    await eventually(lambda: snapshot_key(60) in memory_blobs.objects, "snapshot 60 written")
    assert sorted(encoded) == [f"a{i:05d}" for i in range(10)]


async def test_a_restarted_store_encodes_only_what_changed_in_its_first_snapshot(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = replace(QUIET_LOG, snapshot_every=10)
    await _seed(await open_store(memory_blobs, settings), 50)
    await eventually(lambda: snapshot_key(50) in memory_blobs.objects, "snapshot 50 written")
    restarted = await open_store(memory_blobs, settings)
    encoded: list[str] = []
    to_json = Adapter.to_json

    def counting(adapter: Adapter) -> dict[str, Any]:
        encoded.append(adapter.name)
        return to_json(adapter)

    monkeypatch.setattr(Adapter, "to_json", counting)
    for i in range(10):
        await push(restarted, f"a{i:05d}", tiny_adapter(seed=1))
    await eventually(lambda: snapshot_key(60) in memory_blobs.objects, "snapshot 60 written")
    assert sorted(encoded) == [f"a{i:05d}" for i in range(10)]


class _CountedName(str):
    """An adapter name that counts the order comparisons made with it."""

    comparisons = 0

    def __lt__(self, other: object) -> bool:
        _CountedName.comparisons += 1
        return str.__lt__(self, other)  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        _CountedName.comparisons += 1
        return str.__gt__(self, other)  # type: ignore[operator]


def _state_of(adapters: int) -> StoreState:
    state = StoreState()
    for i in range(adapters):
        name = _CountedName(f"a{i:05d}")
        revision = Revision(
            name, 1, (FileInfo("adapter_config.json", 3, "a" * 64),), "m", 4, 8.0,
            ("q_proj",), now(), "tester", "", i + 1,
        )  # fmt: skip
        state.apply(Change(i + 1, ChangeType.REVISION_PUSHED, name, revision, 1, now(), "t"))
    return state


def _comparisons_for_a_page(state: StoreState, after: str) -> int:
    _CountedName.comparisons = 0
    page = adapter_page(state, 10, 1 << 20, state.seq, "i", after, "", lambda _: 1)
    assert len(page.adapters) == 10
    return _CountedName.comparisons


def test_a_listing_page_compares_names_a_logarithmic_number_of_times() -> None:
    small, large = _state_of(500), _state_of(1000)
    in_small = _comparisons_for_a_page(small, "a00250")
    in_large = _comparisons_for_a_page(large, "a00500")
    # A bisect: one more comparison for twice the names, not twice as many.
    assert in_large <= in_small + 2
    assert in_large < 40
