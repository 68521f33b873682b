"""Commit ids and idempotency keys on the in-memory blob store, the conflict backoff
and the conditional-put probe."""

from __future__ import annotations

import json
import statistics

import pytest

from loraserve.adapterstore.blobs.storageprobe import PROBE_KEY, check_conditional_put
from loraserve.adapterstore.catalog.model import (
    REQUEST_KEY_WINDOW,
    Change,
    ChangeType,
    StoreState,
    now,
)
from loraserve.adapterstore.changelog.logstorage import log_key
from loraserve.adapterstore.changelog.logtypes import (
    CONFLICT_BACKOFF_FIRST_S,
    CONFLICT_BACKOFF_MAX_S,
    LogSettings,
    conflict_backoff,
)
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from loraserve.common.revisions.manifest import Revision
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.store.stores import StoreFactory
from loraserve.testing.waiting import eventually


class LandsThenFails(MemoryBlobStore):
    """A conditional put of a log entry that reaches storage, but whose caller is
    told it failed: the SDK gave up on a request that had landed."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        written = await super().put_if_absent(key, data)
        if key.startswith("log/") and self.failures:
            self.failures -= 1
            raise Unavailable("object storage: conditional put failed: connection reset")
        return written


class IgnoresPreconditions(MemoryBlobStore):
    async def put_if_absent(self, key: str, data: bytes) -> bool:
        await self.put(key, data)
        return True


def _log_entries(blobs: MemoryBlobStore) -> list[dict[str, object]]:
    return [json.loads(v) for k, v in sorted(blobs.objects.items()) if k.startswith("log/")]


async def test_put_reported_failed_that_landed_counts_as_the_commit(
    open_store: StoreFactory,
) -> None:
    blobs = LandsThenFails()
    store = await open_store(blobs)
    blobs.failures = 1
    result = await push(store, "alpha", tiny_adapter())
    assert (result.revision.revision, result.seq) == (1, 1)
    assert len(_log_entries(blobs)) == 1


async def test_every_entry_carries_a_unique_commit_id(
    memory_store: AdapterStore, memory_blobs: MemoryBlobStore
) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    await push(memory_store, "alpha", tiny_adapter(seed=1))
    ids = [entry["commit_id"] for entry in _log_entries(memory_blobs)]
    assert len(set(ids)) == 2
    assert all(ids)


async def test_push_repeated_with_its_key_returns_the_first_result(
    memory_store: AdapterStore, memory_blobs: MemoryBlobStore
) -> None:
    first = await push(memory_store, "alpha", tiny_adapter(), idempotency_key="k-1")
    again = await push(memory_store, "alpha", tiny_adapter(), idempotency_key="k-1")
    assert again == first
    assert len(_log_entries(memory_blobs)) == 1


async def test_key_reused_for_different_content_is_invalid_argument(
    memory_store: AdapterStore,
) -> None:
    await push(memory_store, "alpha", tiny_adapter(), idempotency_key="k-1")
    with pytest.raises(InvalidArgument, match="already used at seq 1 for a different request"):
        await push(memory_store, "alpha", tiny_adapter(seed=1), idempotency_key="k-1")


async def test_set_current_repeated_with_its_key_succeeds_despite_its_expectation(
    memory_store: AdapterStore, memory_blobs: MemoryBlobStore
) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    await push(memory_store, "alpha", tiny_adapter(seed=1))
    _, seq = await memory_store.set_current("alpha", 1, 2, "tester", "k-roll")
    adapter, again = await memory_store.set_current("alpha", 1, 2, "tester", "k-roll")
    assert (adapter.current_revision, again) == (1, seq)
    assert len(_log_entries(memory_blobs)) == 3


async def test_delete_repeated_with_its_key_returns_the_tombstone_seq(
    memory_store: AdapterStore,
) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    seq = await memory_store.delete("alpha", "tester", "k-del")
    assert await memory_store.delete("alpha", "tester", "k-del") == seq


async def test_key_is_remembered_through_a_snapshot_by_a_restarted_store(
    open_store: StoreFactory, memory_blobs: MemoryBlobStore
) -> None:
    snapshots = LogSettings(poll_interval=0.05, snapshot_every=1, log_retention=0)
    first = await open_store(memory_blobs, snapshots)
    pushed = await push(first, "alpha", tiny_adapter(), idempotency_key="k-1")
    await push(first, "beta", tiny_adapter())
    restarted = await open_store(memory_blobs, snapshots)
    assert await push(restarted, "alpha", tiny_adapter(), idempotency_key="k-1") == pushed
    assert len(_log_entries(memory_blobs)) == 2


async def test_key_whose_entry_was_pruned_is_refused_not_committed_again(
    open_store: StoreFactory, memory_blobs: MemoryBlobStore
) -> None:
    pruning = LogSettings(poll_interval=0.05, snapshot_every=1, log_retention=1)
    first = await open_store(memory_blobs, pruning)
    await push(first, "alpha", tiny_adapter(), idempotency_key="k-1")
    await push(first, "beta", tiny_adapter())
    # Snapshots and pruning run in the background.
    await eventually(lambda: log_key(1) not in memory_blobs.objects, "entry 1 pruned")
    restarted = await open_store(memory_blobs, pruning)
    with pytest.raises(FailedPrecondition, match="no longer kept"):
        await push(restarted, "alpha", tiny_adapter(), idempotency_key="k-1")
    assert restarted.head_seq == 2


async def test_key_repeated_through_a_second_replica_makes_no_second_revision(
    open_store: StoreFactory, memory_blobs: MemoryBlobStore
) -> None:
    first = await open_store(memory_blobs)
    second = await open_store(memory_blobs)
    pushed = await push(first, "alpha", tiny_adapter(), idempotency_key="k-1")
    assert await push(second, "alpha", tiny_adapter(), idempotency_key="k-1") == pushed
    assert len(_log_entries(memory_blobs)) == 1


def _pushed(seq: int, name: str, key: str) -> Change:
    revision = Revision(name, 1, (), "base", 4, 8.0, ("q_proj",), now(), "t", "", seq)
    return Change(seq, ChangeType.REVISION_PUSHED, name, revision, 1, now(), "t", request_key=key)


def test_keys_are_forgotten_once_older_than_the_window() -> None:
    state = StoreState()
    state.apply(_pushed(1, "alpha", "k-old"))
    state.seq = REQUEST_KEY_WINDOW - 1
    state.apply(_pushed(REQUEST_KEY_WINDOW, "beta", "k-new"))
    assert list(state.requests) == ["k-old", "k-new"]
    state.apply(_pushed(REQUEST_KEY_WINDOW + 1, "gamma", ""))
    assert list(state.requests) == ["k-new"]
    restored = StoreState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored.requests == state.requests


@pytest.mark.parametrize("key", ["has space", "x" * 129, "ünïcode"])
async def test_malformed_key_is_invalid_argument(memory_store: AdapterStore, key: str) -> None:
    with pytest.raises(InvalidArgument, match="idempotency_key must be"):
        await push(memory_store, "alpha", tiny_adapter(), idempotency_key=key)


def test_conflict_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    backoffs = [conflict_backoff() for _ in range(50)]
    delays = [[backoff.next_delay() for _ in range(12)] for backoff in backoffs]
    for attempt in range(12):
        ceiling = min(CONFLICT_BACKOFF_MAX_S, CONFLICT_BACKOFF_FIRST_S * 2**attempt)
        column = [run[attempt] for run in delays]
        assert all(ceiling / 2 - 1e-12 <= d <= ceiling + 1e-12 for d in column)
        if ceiling > CONFLICT_BACKOFF_FIRST_S:
            assert statistics.pstdev(column) > 0  # jittered, not lockstep
    assert max(max(run) for run in delays) <= CONFLICT_BACKOFF_MAX_S + 1e-12


async def test_probe_passes_on_storage_that_honours_if_none_match() -> None:
    blobs = MemoryBlobStore()
    await check_conditional_put(blobs)
    await check_conditional_put(blobs)
    assert list(blobs.objects) == [PROBE_KEY]


async def test_probe_refuses_storage_that_ignores_if_none_match() -> None:
    with pytest.raises(FailedPrecondition, match="ignores If-None-Match"):
        await check_conditional_put(IgnoresPreconditions())
