"""The store's operations and its change log, on the in-memory blob store."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from loraserve.adapterstore.catalog.model import Change, ChangeType
from loraserve.adapterstore.changelog import logstorage
from loraserve.adapterstore.changelog.log import LogSettings
from loraserve.adapterstore.changelog.logstorage import log_key
from loraserve.adapterstore.changelog.watching import Heartbeat
from loraserve.adapterstore.files.push import Chunk
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.errors import Aborted, DataLoss, InvalidArgument, NotFound, OutOfRange
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.store.stores import StoreFactory
from loraserve.testing.waiting import GUARD_S, eventually


async def _events(store: AdapterStore, after_seq: int, count: int) -> list[Change]:
    events: list[Change] = []
    async with asyncio.timeout(GUARD_S):
        async for item in store.watch(after_seq):
            if isinstance(item, Change):
                events.append(item)
                if len(events) == count:
                    return events
    raise AssertionError("watch ended")


async def _download(store: AdapterStore, name: str, revision: int = 0) -> dict[str, bytes]:
    files: dict[str, bytearray] = {}
    async for item in store.download(name, revision):
        if isinstance(item, Chunk):
            files.setdefault(item.file_name, bytearray()).extend(item.data)
    return {k: bytes(v) for k, v in files.items()}


async def test_push_commits_revision_one_and_makes_it_current(memory_store: AdapterStore) -> None:
    result = await push(memory_store, "alpha", tiny_adapter())
    assert (result.revision.revision, result.promoted, result.seq) == (1, True, 1)
    adapter, revision = await memory_store.get("alpha")
    assert adapter.current_revision == 1
    assert (revision.rank, revision.alpha, revision.target_modules) == (
        4,
        8.0,
        ("q_proj", "v_proj"),
    )
    assert revision.pushed_by == "tester"


async def test_identical_content_makes_new_revision_but_no_new_blob(
    memory_store: AdapterStore, memory_blobs: MemoryBlobStore
) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    blobs_before = {k for k in memory_blobs.objects if k.startswith("blobs/")}
    result = await push(memory_store, "alpha", tiny_adapter())
    assert result.revision.revision == 2
    assert {k for k in memory_blobs.objects if k.startswith("blobs/")} == blobs_before
    assert not any(k.startswith("tmp/") for k in memory_blobs.objects)


async def test_no_promote_push_leaves_current(memory_store: AdapterStore) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    result = await push(memory_store, "alpha", tiny_adapter(seed=1), no_promote=True)
    assert not result.promoted
    assert (await memory_store.get("alpha"))[0].current_revision == 1


async def test_first_push_without_promote_has_no_current(memory_store: AdapterStore) -> None:
    await push(memory_store, "alpha", tiny_adapter(), no_promote=True)
    with pytest.raises(NotFound, match="no current revision"):
        await memory_store.get("alpha")
    assert (await memory_store.get("alpha", 1))[1].revision == 1


async def test_download_returns_the_pushed_bytes(memory_store: AdapterStore) -> None:
    files = tiny_adapter()
    await push(memory_store, "alpha", files)
    assert await _download(memory_store, "alpha") == files


async def test_download_of_corrupt_blob_ends_with_data_loss(
    memory_store: AdapterStore, memory_blobs: MemoryBlobStore
) -> None:
    files = tiny_adapter()
    await push(memory_store, "alpha", files)
    key = "blobs/sha256/" + hashlib.sha256(files["adapter_model.safetensors"]).hexdigest()
    memory_blobs.objects[key] = b"x" + memory_blobs.objects[key][1:]
    with pytest.raises(DataLoss, match=r"adapter_model\.safetensors"):
        await _download(memory_store, "alpha")


async def test_list_adapters_pages_by_name_and_reports_seq(memory_store: AdapterStore) -> None:
    for name in ("c", "a", "b"):
        await push(memory_store, name, tiny_adapter())
    first = await memory_store.list_adapters(2, "")
    second = await memory_store.list_adapters(2, first.next_page_token)
    assert [a.name for a in first.adapters] == ["a", "b"]
    assert [a.name for a in second.adapters] == ["c"]
    assert second.next_page_token == ""
    assert first.seq == 3


async def test_list_adapters_filters_by_base_model(memory_store: AdapterStore) -> None:
    await push(memory_store, "a", tiny_adapter())
    assert [a.name for a in (await memory_store.list_adapters(0, "", "tiny-llama")).adapters] == [
        "a"
    ]
    assert (await memory_store.list_adapters(0, "", "other")).adapters == []


async def test_bad_page_token_is_invalid_argument(memory_store: AdapterStore) -> None:
    with pytest.raises(InvalidArgument, match="page_token"):
        await memory_store.list_revisions("a", 0, "%%%")


async def test_list_revisions_pages_newest_first(memory_store: AdapterStore) -> None:
    for seed in range(3):
        await push(memory_store, "alpha", tiny_adapter(seed=seed))
    first = await memory_store.list_revisions("alpha", 2, "")
    second = await memory_store.list_revisions("alpha", 2, first.next_page_token)
    assert [r.revision for r in first.revisions] == [3, 2]
    assert [r.revision for r in second.revisions] == [1]
    assert (second.next_page_token, first.current_revision) == ("", 3)


async def test_rollback_moves_current_and_emits_event(memory_store: AdapterStore) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    await push(memory_store, "alpha", tiny_adapter(seed=1))
    adapter, seq = await memory_store.set_current("alpha", 1, 2, "ops")
    assert (adapter.current_revision, seq) == (1, 3)
    (event,) = await _events(memory_store, 2, 1)
    assert (event.type, event.current_revision, event.actor) == (
        ChangeType.CURRENT_REVISION_SET,
        1,
        "ops",
    )


async def test_set_current_with_stale_expectation_is_aborted(memory_store: AdapterStore) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    await push(memory_store, "alpha", tiny_adapter(seed=1))
    with pytest.raises(Aborted, match="not the expected 1"):
        await memory_store.set_current("alpha", 1, 1, "ops")
    assert memory_store.head_seq == 2


async def test_set_current_to_unknown_revision_is_not_found(memory_store: AdapterStore) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    with pytest.raises(NotFound, match="alpha@9"):
        await memory_store.set_current("alpha", 9, 0, "ops")


async def test_delete_hides_adapter_and_later_push_continues_numbering(
    memory_store: AdapterStore,
) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    await memory_store.delete("alpha", "ops")
    with pytest.raises(NotFound):
        await memory_store.get("alpha")
    result = await push(memory_store, "alpha", tiny_adapter())
    assert result.revision.revision == 2


async def test_delete_of_unknown_adapter_is_not_found(memory_store: AdapterStore) -> None:
    with pytest.raises(NotFound):
        await memory_store.delete("ghost", "ops")


async def test_concurrent_pushes_through_two_stores_get_consecutive_revisions(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    stores = [await open_store(memory_blobs), await open_store(memory_blobs)]
    results = await asyncio.gather(
        *(push(stores[i % 2], "alpha", tiny_adapter(seed=i)) for i in range(10))
    )
    assert sorted(r.revision.revision for r in results) == list(range(1, 11))
    assert sorted(r.seq for r in results) == list(range(1, 11))


async def test_watch_resumes_after_a_seq_with_every_missed_change_once(
    memory_store: AdapterStore,
) -> None:
    for seed in range(4):
        await push(memory_store, "alpha", tiny_adapter(seed=seed))
    events = await _events(memory_store, 1, 3)
    assert [e.seq for e in events] == [2, 3, 4]
    assert [e.revision.revision for e in events if e.revision] == [2, 3, 4]


async def test_watch_sends_heartbeats_with_the_head_seq(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    store = await open_store(memory_blobs, heartbeat_interval=0.05)
    await push(store, "alpha", tiny_adapter())
    async with asyncio.timeout(GUARD_S):
        async for item in store.watch(1):
            assert isinstance(item, Heartbeat)
            assert item.seq == 1
            break


async def test_watch_sees_commits_of_another_store(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    watcher, writer = await open_store(memory_blobs), await open_store(memory_blobs)
    watching = asyncio.create_task(_events(watcher, 0, 2))
    await push(writer, "alpha", tiny_adapter())
    await writer.delete("alpha", "ops")
    events = await watching
    assert [e.type for e in events] == [ChangeType.REVISION_PUSHED, ChangeType.ADAPTER_DELETED]


async def test_watch_behind_the_kept_log_is_out_of_range(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    settings = LogSettings(poll_interval=0.05, snapshot_every=3, log_retention=1, memory_events=2)
    store = await open_store(memory_blobs, settings)
    for seed in range(6):
        await push(store, "alpha", tiny_adapter(seed=seed))
    # Snapshots and pruning run in the background.
    await eventually(lambda: log_key(1) not in memory_blobs.objects, "entry 1 pruned")
    with pytest.raises(OutOfRange, match="list adapters"):
        await _events(store, 0, 1)


async def test_restart_loads_snapshot_and_log_tail(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    settings = LogSettings(poll_interval=0.05, snapshot_every=3, log_retention=1)
    first = await open_store(memory_blobs, settings)
    for seed in range(5):
        await push(first, "alpha", tiny_adapter(seed=seed))
    second = await open_store(memory_blobs, settings)
    assert second.head_seq == 5
    assert (await second.get("alpha"))[0].latest_revision == 5


async def test_store_behind_a_pruned_gap_reloads_the_snapshot(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    settings = LogSettings(poll_interval=60, snapshot_every=3, log_retention=1)
    lagging = await open_store(memory_blobs, settings)
    writer = await open_store(memory_blobs, settings)
    for seed in range(4):
        await push(writer, "alpha", tiny_adapter(seed=seed))
    result = await push(lagging, "alpha", tiny_adapter(seed=9))
    assert (result.revision.revision, result.seq) == (5, 5)


async def test_store_whose_block_fence_was_pruned_reloads_the_snapshot(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The lagging store is at seq 2, the last entry of its block: it finds entry 3
    # missing and entry 2 gone too, so only the snapshots can tell it that it is behind.
    monkeypatch.setattr(logstorage, "PRUNE_BLOCK", 2)
    settings = LogSettings(poll_interval=60, snapshot_every=3, log_retention=1)
    lagging = await open_store(memory_blobs, settings)
    writer = await open_store(memory_blobs, settings)
    for seed in range(2):
        await push(lagging, "alpha", tiny_adapter(seed=seed))
    for seed in range(2, 6):
        await push(writer, "alpha", tiny_adapter(seed=seed))
    await eventually(lambda: log_key(5) not in memory_blobs.objects, "entries 1-5 pruned")
    result = await push(lagging, "alpha", tiny_adapter(seed=9))
    assert (result.revision.revision, result.seq) == (7, 7)


async def test_snapshot_due_while_one_is_being_written_is_written_after_it(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await open_store(memory_blobs, LogSettings(poll_interval=60, snapshot_every=1))
    written = asyncio.Event()
    put_if_absent = memory_blobs.put_if_absent

    async def held_snapshot(key: str, data: bytes) -> bool:
        if key.startswith(logstorage.SNAPSHOT_PREFIX):
            await written.wait()
        return await put_if_absent(key, data)

    monkeypatch.setattr(memory_blobs, "put_if_absent", held_snapshot)
    await push(store, "alpha", tiny_adapter())
    await push(store, "beta", tiny_adapter())
    written.set()
    # No commit follows the second: its snapshot must not wait for one.
    await eventually(
        lambda: logstorage.snapshot_key(2) in memory_blobs.objects, "snapshot at seq 2 written"
    )
