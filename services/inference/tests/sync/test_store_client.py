"""The store client against a real adapter store server over moto S3."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.clients.downloads import FileChunk
from loraserve.clients.replicareport import StatusBatch
from loraserve.clients.store import (
    EventKind,
    StoreClient,
    StoreClientSettings,
    StoreEvent,
)
from loraserve.common.errors import NotFound, Unavailable
from loraserve.common.fleet.reports import (
    AdapterReport,
    ReplicaError,
    RevisionReport,
    ServingState,
)
from loraserve.common.revisions.manifest import Revision
from loraserve.common.rpc.security import ClientSecurity
from loraserve.common.statusshards import shard_of
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.store.server import RunningStore


def settings(address: str, **overrides: Any) -> StoreClientSettings:
    base = StoreClientSettings(address=address, security=ClientSecurity(), replica_id="r1")
    return replace(base, **overrides)


@pytest.fixture
async def store_stub(store_server: RunningStore) -> AsyncIterator[pb_grpc.AdapterStoreServiceStub]:
    async with grpc.aio.insecure_channel(store_server.address) as channel:
        yield pb_grpc.AdapterStoreServiceStub(channel)


@pytest.fixture
async def client(store_server: RunningStore) -> AsyncIterator[StoreClient]:
    client = StoreClient.connect(settings(store_server.address, page_size=2))
    yield client
    await client.close()


async def push(stub: pb_grpc.AdapterStoreServiceStub, name: str, seed: int = 0) -> int:
    response = await stub.PushAdapter(push_requests(name, tiny_adapter(seed=seed)))
    revision: int = response.revision.revision
    return revision


async def test_listing_reads_every_page_and_keeps_the_first_pages_seq(
    client: StoreClient, store_stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    for name in ("a", "b", "c"):
        await push(store_stub, name)
    listing = await client.list_adapters()
    assert [a.name for a in listing.adapters] == ["a", "b", "c"]
    assert listing.seq == 3
    current = listing.adapters[0].current
    assert current is not None
    assert (current.adapter_name, current.revision, current.rank) == ("a", 1, 4)


async def test_watch_yields_pushes_with_their_manifests(
    client: StoreClient, store_stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await push(store_stub, "a", seed=1)
    await push(store_stub, "a", seed=2)
    events: list[StoreEvent] = []
    async for item in client.watch(0):
        assert isinstance(item, StoreEvent)
        events.append(item)
        if len(events) == 2:
            break
    assert [(e.seq, e.kind, e.name, e.current_revision) for e in events] == [
        (1, EventKind.REVISION_PUSHED, "a", 1),
        (2, EventKind.REVISION_PUSHED, "a", 2),
    ]
    assert events[1].revision is not None
    assert {f.name for f in events[1].revision.files} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }


async def test_download_sends_the_manifest_then_the_files_bytes(
    client: StoreClient, store_stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await push(store_stub, "a")
    files = tiny_adapter()
    messages = [m async for m in client.download("a", 1)]
    assert isinstance(messages[0], Revision)
    received: dict[str, bytes] = {}
    for chunk in messages[1:]:
        assert isinstance(chunk, FileChunk)
        received[chunk.file_name] = received.get(chunk.file_name, b"") + chunk.data
    assert received == files


async def test_unknown_revision_is_not_found(client: StoreClient) -> None:
    with pytest.raises(NotFound, match="missing"):
        await client.get_revision("missing", 1)


async def test_nack_reaches_the_stores_status_with_code_and_reason(
    client: StoreClient, store_stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await push(store_stub, "a")
    failed = RevisionReport(1, ServingState.FAILED, ReplicaError(9, "rank 64 > 16"))
    batch = StatusBatch(0, "", 60.0, {shard_of("a"): (AdapterReport("a", 0, (failed,)),)})
    assert await client.report_status(batch) is False
    response = await store_stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="a"))
    [status] = response.statuses
    assert (status.replica_id, status.type, status.reported_revision) == (
        "r1",
        pb.REPORT_TYPE_NACK,
        1,
    )
    [revision] = status.revisions
    assert (revision.state, revision.error.code, revision.error.message) == (
        pb.REVISION_SERVING_STATE_FAILED,
        9,
        "rank 64 > 16",
    )


async def test_store_that_is_not_there_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = StoreClient.connect(settings(f"127.0.0.1:{port}", call_timeout_s=2.0))
    try:
        with pytest.raises(Unavailable):
            await client.list_adapters()
    finally:
        await client.close()


async def test_silent_watch_is_reported_unavailable_after_the_idle_timeout(
    store_server: RunningStore,
) -> None:
    client = StoreClient.connect(settings(store_server.address, idle_timeout_s=0.2))
    try:
        with pytest.raises(Unavailable, match="nothing received"):
            async for _ in client.watch(0):
                pass
    finally:
        await client.close()
