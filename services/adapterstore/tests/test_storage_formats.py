"""Stored objects say the lowest reader format that reads them: a store reads every
format it knows, skipping fields it does not know, and refuses a newer one by name."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from loraserve.adapterstore.__main__ import EXIT_UNSUPPORTED_FORMAT
from loraserve.adapterstore.catalog.model import StoreState
from loraserve.adapterstore.changelog.incarnation import INCARNATION_KEY, read_incarnation
from loraserve.adapterstore.changelog.log import ChangeLog, LogSettings
from loraserve.adapterstore.changelog.logstorage import log_key, parse_change, snapshot_key
from loraserve.adapterstore.changelog.snapshots import latest_snapshot
from loraserve.adapterstore.compat import READ_FORMAT, UnsupportedFormat, check_readable
from loraserve.adapterstore.compat.presence import STORE_PREFIX
from loraserve.adapterstore.replicas.model import replica_key
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.adapterstore.settings import parse_settings
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.processes.services import store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.stores import StoreFactory
from loraserve.testing.waiting import eventually

EVERY_COMMIT = LogSettings(poll_interval=0.05, snapshot_every=1, log_retention=0)


def _snapshot(blobs: MemoryBlobStore, seq: int) -> bytes:
    return blobs.objects[snapshot_key(seq)]


async def _format_2_snapshot(blobs: MemoryBlobStore, open_store: StoreFactory) -> Any:
    """alpha@1 pushed through a store that writes format 2, and its snapshot's JSON."""
    writer = await open_store(blobs, EVERY_COMMIT, storage_format=lambda: 2)
    await push(writer, "alpha", tiny_adapter())
    await eventually(lambda: snapshot_key(1) in blobs.objects, "snapshot 1 written")
    return json.loads(gzip.decompress(_snapshot(blobs, 1)))


def test_an_object_of_a_format_newer_than_the_reader_is_refused_naming_the_format() -> None:
    with pytest.raises(UnsupportedFormat) as refused:
        check_readable({"format": READ_FORMAT + 1, "writer": "9.1.0"}, "snapshot 7")
    assert f"needs storage format {READ_FORMAT + 1}" in refused.value.message
    assert "written by loraserve 9.1.0" in refused.value.message
    assert f"--storage-format {READ_FORMAT}" in refused.value.message


@pytest.mark.parametrize("found", [None, 0, "1", True])
def test_an_object_without_a_valid_format_is_refused(found: object) -> None:
    with pytest.raises(UnsupportedFormat, match="no valid format"):
        check_readable({"format": found}, "log entry 3")


async def test_a_format_2_snapshot_is_gzip_and_reads_back_as_the_state(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    store = await open_store(memory_blobs, EVERY_COMMIT, storage_format=lambda: 2)
    await push(store, "alpha", tiny_adapter())
    await eventually(lambda: snapshot_key(1) in memory_blobs.objects, "snapshot 1 written")
    data = _snapshot(memory_blobs, 1)
    inner = json.loads(gzip.decompress(data))
    assert (inner["format"], inner["seq"], inner["writer"]) == (2, 1, inner["writer"])
    read = await latest_snapshot(memory_blobs)
    assert read is not None
    state, storage_format = read
    assert (sorted(state.adapters), storage_format) == (["alpha"], 2)
    assert state.to_json() == StoreState.from_json(inner).to_json()


async def test_a_format_1_snapshot_is_the_json_that_release_0_1_0_reads(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    store = await open_store(memory_blobs, EVERY_COMMIT)
    await push(store, "alpha", tiny_adapter())
    await eventually(lambda: snapshot_key(1) in memory_blobs.objects, "snapshot 1 written")
    document = json.loads(_snapshot(memory_blobs, 1))
    assert document["format"] == 1
    assert "writer" not in document


async def test_each_snapshot_is_written_in_the_format_asked_for_at_its_write(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    formats = iter([1, 2])
    store = await open_store(memory_blobs, EVERY_COMMIT, storage_format=lambda: next(formats))
    await push(store, "alpha", tiny_adapter())
    await eventually(lambda: snapshot_key(1) in memory_blobs.objects, "snapshot 1 written")
    await push(store, "beta", tiny_adapter())
    await eventually(lambda: snapshot_key(2) in memory_blobs.objects, "snapshot 2 written")
    assert json.loads(_snapshot(memory_blobs, 1))["format"] == 1
    assert _snapshot(memory_blobs, 2).startswith(b"\x1f\x8b")


async def test_a_store_held_to_format_1_rewrites_a_newer_newest_snapshot_in_format_1(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    writer = await open_store(memory_blobs, EVERY_COMMIT, storage_format=lambda: 2)
    await push(writer, "alpha", tiny_adapter())
    await eventually(lambda: snapshot_key(1) in memory_blobs.objects, "snapshot 1 written")
    await writer.close()
    held = ChangeLog(memory_blobs, EVERY_COMMIT, lambda: 1)
    await held.start()
    try:
        assert held.write_older_snapshot(1)
        await eventually(
            lambda: not _snapshot(memory_blobs, 1).startswith(b"\x1f\x8b"), "rewritten"
        )
    finally:
        await held.close()
    assert json.loads(_snapshot(memory_blobs, 1))["format"] == 1


async def test_a_store_starts_on_a_snapshot_that_carries_fields_it_does_not_know(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    document = await _format_2_snapshot(memory_blobs, open_store)
    document["added_by_a_later_release"] = {"anything": [1, 2]}
    document["adapters"][0]["also_added"] = "x"
    memory_blobs.objects[snapshot_key(1)] = gzip.compress(json.dumps(document).encode())
    memory_blobs.objects.pop(log_key(1))
    reader = await open_store(memory_blobs, EVERY_COMMIT)
    assert reader.head_seq == 1
    adapter, _ = await reader.get("alpha")
    assert adapter.name == "alpha"


async def test_a_store_refuses_to_start_on_a_snapshot_in_a_newer_format(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    document = await _format_2_snapshot(memory_blobs, open_store)
    document |= {"format": READ_FORMAT + 1, "writer": "9.0.0"}
    memory_blobs.objects[snapshot_key(1)] = gzip.compress(json.dumps(document).encode())
    with pytest.raises(UnsupportedFormat, match=f"needs storage format {READ_FORMAT + 1}"):
        await open_store(memory_blobs, EVERY_COMMIT)


def test_a_log_entry_with_fields_the_reader_does_not_know_is_read_without_them() -> None:
    entry = {
        "format": 1,
        "seq": 4,
        "type": "adapter_deleted",
        "adapter_name": "alpha",
        "revision": None,
        "current_revision": 0,
        "time": "2026-12-01T00:00:00+00:00",
        "actor": "someone",
        "commit_id": "c",
        "a_field_from_a_later_release": {"nested": True},
    }
    change = parse_change(json.dumps(entry).encode(), 4)
    assert (change.seq, change.adapter_name) == (4, "alpha")


def test_a_log_entry_in_a_newer_format_is_refused_not_called_corrupt() -> None:
    entry = {"format": READ_FORMAT + 1, "seq": 4, "writer": "9.0.0"}
    with pytest.raises(UnsupportedFormat, match="log entry"):
        parse_change(json.dumps(entry).encode(), 4)


def test_the_storage_format_flag_refuses_a_format_this_release_cannot_write(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_settings(["serve", "--bucket", "b", "--storage-format", "3"], {})
    assert exited.value.code == 2
    assert "storage format 3 is not one of 1..2" in capsys.readouterr().err


def test_the_storage_format_defaults_to_the_newest_this_release_reads() -> None:
    settings = parse_settings(["serve", "--bucket", "b"], {})
    assert settings.formats.storage_format == READ_FORMAT


@pytest.mark.slow
async def test_a_store_process_exits_naming_the_format_a_newer_release_wrote(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    state = {"format": READ_FORMAT + 1, "writer": "9.0.0", "seq": 5, "adapters": []}
    client = s3_bucket.client()
    client.put_object(
        Bucket=s3_bucket.bucket,
        Key=snapshot_key(5),
        Body=gzip.compress(json.dumps(state).encode()),
    )
    log_path = tmp_path / "store.log"
    async with store_process(s3_bucket, log_path, wait_serving=False) as store:
        assert await store.wait() == EXIT_UNSUPPORTED_FORMAT
    logged = log_path.read_text()
    assert "store.format_unsupported" in logged
    assert f"needs storage format {READ_FORMAT + 1} (written by loraserve 9.0.0)" in logged


@pytest.mark.slow
async def test_a_store_process_announces_itself_and_withdraws_when_stopped(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    def announced() -> list[str]:
        listed = s3_bucket.keys()
        return [k for k in listed if k.startswith(STORE_PREFIX)]

    extra = ["--presence-interval", "0.2"]
    async with store_process(s3_bucket, tmp_path / "store.log", extra=extra) as store:
        await eventually(lambda: len(announced()) == 1, "the store announced")
        store.terminate()
        assert await store.wait() == 0
    assert announced() == []


async def test_an_incarnation_in_a_newer_format_is_refused_naming_it(
    memory_blobs: MemoryBlobStore,
) -> None:
    document = {"format": READ_FORMAT + 1, "incarnation": "abc"}
    memory_blobs.objects[INCARNATION_KEY] = json.dumps(document).encode()
    with pytest.raises(UnsupportedFormat, match=f"needs storage format {READ_FORMAT + 1}"):
        await read_incarnation(memory_blobs)


async def test_an_incarnation_0_1_0_wrote_without_a_format_is_read(
    memory_blobs: MemoryBlobStore,
) -> None:
    memory_blobs.objects[INCARNATION_KEY] = json.dumps({"incarnation": "abc"}).encode()
    assert await read_incarnation(memory_blobs) == "abc"


async def test_a_sign_of_life_in_a_newer_format_is_not_read_as_a_live_replica(
    memory_blobs: MemoryBlobStore,
) -> None:
    statuses = ReplicaStatusStore(memory_blobs)
    await statuses.alive("replica-a")
    document = json.loads(memory_blobs.objects[replica_key("replica-a")])
    assert document["format"] == 1
    memory_blobs.objects[replica_key("replica-a")] = json.dumps(
        document | {"format": READ_FORMAT + 1}
    ).encode()
    statuses.reader.forget(replica_key("replica-a"))
    assert await statuses.reader.replicas() == {}
