"""A store writes the newest storage format every live store on the bucket reads:
it learns the stores of 0.2.0 and later from their announcements, and stores of 0.1.0
from the replicas' signs of life they write without saying what they read."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from loraserve.adapterstore.api.metrics import StoreMetrics
from loraserve.adapterstore.compat.gate import FormatGate, FormatSettings
from loraserve.adapterstore.compat.presence import STORE_PREFIX, StorePresence, presence_key
from loraserve.adapterstore.replicas.model import SignOfLife, replica_key
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.release import RELEASE
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.waiting import eventually

TTL_S = 300.0


def _gate(blobs: MemoryBlobStore, storage_format: int = 2) -> FormatGate:
    statuses = ReplicaStatusStore(blobs, TTL_S)
    return FormatGate(blobs, statuses.reader, FormatSettings(storage_format, 1.0), TTL_S)


def _announce(blobs: MemoryBlobStore, store_id: str, read_format: int, age_s: float = 0) -> None:
    seen = datetime.now(UTC) - timedelta(seconds=age_s)
    presence = StorePresence(store_id, "x", read_format, seen, interval_s=1.0)
    blobs.objects[presence_key(store_id)] = presence.encode()


def _sign_of_life(blobs: MemoryBlobStore, replica: str, store_format: int, age_s: float) -> None:
    seen = datetime.now(UTC) - timedelta(seconds=age_s)
    sign = SignOfLife(replica, seen, 3, "inc", 5.0, store_format=store_format)
    document = sign.to_json()
    if store_format == 0:
        # As a store of 0.1.0 writes it: it knows no such field.
        del document["store_format"]
    blobs.objects[replica_key(replica)] = json.dumps(document).encode()


async def test_a_gate_writes_the_oldest_format_until_it_has_looked() -> None:
    assert _gate(MemoryBlobStore()).write_format == 1


async def test_a_store_alone_on_the_bucket_writes_the_newest_format() -> None:
    gate = _gate(MemoryBlobStore())
    await gate.look()
    assert gate.write_format == 2


async def test_a_store_announces_itself_on_the_bucket() -> None:
    blobs = MemoryBlobStore()
    gate = _gate(blobs)
    await gate.look()
    announced = StorePresence.decode(blobs.objects[presence_key(gate.store_id)])
    assert (announced.store_id, announced.read_format) == (gate.store_id, 2)


async def test_a_live_store_that_reads_only_format_1_holds_the_bucket_at_format_1() -> None:
    blobs = MemoryBlobStore()
    _announce(blobs, "older", read_format=1)
    gate = _gate(blobs)
    await gate.look()
    assert gate.write_format == 1


async def test_a_store_that_stopped_announcing_no_longer_holds_the_format_down() -> None:
    blobs = MemoryBlobStore()
    _announce(blobs, "older", read_format=1, age_s=10)
    gate = _gate(blobs)
    await gate.look()
    assert gate.write_format == 2


async def test_an_announcement_older_than_the_ttl_is_deleted() -> None:
    blobs = MemoryBlobStore()
    _announce(blobs, "gone", read_format=2, age_s=TTL_S + 1)
    await _gate(blobs).look()
    assert presence_key("gone") not in blobs.objects


async def test_an_announcement_from_a_newer_store_does_not_hold_the_format_down() -> None:
    blobs = MemoryBlobStore()
    blobs.objects[f"{STORE_PREFIX}newer.json"] = json.dumps({"format": 2, "x": 1}).encode()
    gate = _gate(blobs)
    await gate.look()
    assert gate.write_format == 2


async def test_a_live_sign_of_life_a_0_1_0_store_wrote_holds_the_bucket_at_format_1() -> None:
    blobs = MemoryBlobStore()
    _sign_of_life(blobs, "replica-a", store_format=0, age_s=1)
    gate = _gate(blobs)
    await gate.look()
    assert gate.write_format == 1


async def test_signs_of_life_written_by_stores_that_say_what_they_read_hold_nothing() -> None:
    blobs = MemoryBlobStore()
    _sign_of_life(blobs, "replica-a", store_format=2, age_s=1)
    gate = _gate(blobs)
    await gate.look()
    assert gate.write_format == 2


async def test_the_format_moves_up_once_the_0_1_0_sign_of_life_is_past_the_ttl() -> None:
    blobs = MemoryBlobStore()
    _sign_of_life(blobs, "replica-a", store_format=0, age_s=1)
    gate = _gate(blobs)
    await gate.look()
    _sign_of_life(blobs, "replica-a", store_format=0, age_s=TTL_S + 1)
    await gate.look()
    assert gate.write_format == 2


async def test_the_storage_format_flag_caps_what_is_written() -> None:
    gate = _gate(MemoryBlobStore(), storage_format=1)
    await gate.look()
    assert gate.write_format == 1


async def test_a_sign_of_life_a_new_store_rewrites_says_what_that_store_reads() -> None:
    blobs = MemoryBlobStore()
    _sign_of_life(blobs, "replica-a", store_format=0, age_s=1)
    statuses = ReplicaStatusStore(blobs, TTL_S)
    await statuses.alive("replica-a")
    seen = SignOfLife.from_json(json.loads(blobs.objects[replica_key("replica-a")]))
    assert seen.store_format == 2


async def test_a_stopped_gate_withdraws_its_announcement() -> None:
    blobs = MemoryBlobStore()
    gate = _gate(blobs)
    running = asyncio.create_task(gate.run())
    await eventually(lambda: presence_key(gate.store_id) in blobs.objects, "announced")
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert presence_key(gate.store_id) not in blobs.objects


async def test_store_metrics_show_the_format_the_store_writes_and_its_release(
    memory_store: AdapterStore,
) -> None:
    registry = StoreMetrics(memory_store, storage_format=lambda: 2).registry
    assert registry.get_sample_value("loraserve_adapterstore_storage_format") == 2
    assert registry.get_sample_value("loraserve_build_info", {"version": RELEASE}) == 1
