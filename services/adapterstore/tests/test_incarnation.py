"""The store's incarnation and a watch's position in it (issue 29, items 2 and 3):
real gRPC on 127.0.0.1, S3 over real HTTP (moto's server)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.blobs.s3blobs import S3BlobStore
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import serve_store
from loraserve.testing.store.stores import s3_location
from loraserve.testing.waiting import GUARD_S

# Heartbeats this often: a watch that is wrongly accepted shows it at once.
QUICK_HEARTBEATS: dict[str, Any] = {"heartbeat_interval": 0.1}


async def _first_message(stub: Any, request: pb.WatchAdaptersRequest) -> pb.WatchAdaptersResponse:
    call = stub.WatchAdapters(request, timeout=GUARD_S)
    try:
        message = await call.read()
        if message is grpc.aio.EOF:
            await call
            raise AssertionError("the watch ended without a message")
        assert isinstance(message, pb.WatchAdaptersResponse)
        return message
    finally:
        call.cancel()


async def _watch_code(stub: Any, request: pb.WatchAdaptersRequest) -> grpc.StatusCode:
    try:
        message = await _first_message(stub, request)
    except grpc.aio.AioRpcError as e:
        return e.code()
    raise AssertionError(f"the watch was accepted; first message: {message}")


async def _heartbeats_until_the_end(call: Any) -> None:
    while (await call.read()).HasField("heartbeat"):
        pass
    raise AssertionError("the watch sent an event")


def _empty(bucket: S3Bucket) -> None:
    client = bucket.client()
    keys = bucket.keys()
    for key in keys:
        client.delete_object(Bucket=bucket.bucket, Key=key)


async def test_watch_after_seq_beyond_the_head_is_out_of_range(s3_bucket: S3Bucket) -> None:
    async with serve_store(s3_bucket, **QUICK_HEARTBEATS) as server:
        for seed in range(2):
            await push(server.stub, "a", tiny_adapter(seed=seed))
        code = await _watch_code(server.stub, pb.WatchAdaptersRequest(after_seq=5))
        at_head = await _first_message(server.stub, pb.WatchAdaptersRequest(after_seq=2))
    assert code == grpc.StatusCode.OUT_OF_RANGE
    assert at_head.heartbeat.seq == 2


async def test_listing_and_heartbeats_name_one_incarnation_across_store_replicas(
    s3_bucket: S3Bucket,
) -> None:
    async with (
        serve_store(s3_bucket, **QUICK_HEARTBEATS) as a,
        serve_store(s3_bucket, **QUICK_HEARTBEATS) as b,
    ):
        await push(a.stub, "a", tiny_adapter())
        listed_a = await a.stub.ListAdapters(pb.ListAdaptersRequest())
        listed_b = await b.stub.ListAdapters(pb.ListAdaptersRequest())
        heartbeat = await _first_message(b.stub, pb.WatchAdaptersRequest(after_seq=1))
    assert listed_a.incarnation
    assert listed_a.incarnation == listed_b.incarnation == heartbeat.heartbeat.incarnation


async def test_store_replicas_starting_together_agree_on_one_incarnation(
    serial_s3_bucket: S3Bucket,
) -> None:
    # Imported here: the rest of this file runs (and fails) against a store without it.
    from loraserve.adapterstore.changelog.incarnation import ensure_incarnation

    stores = [S3BlobStore(s3_location(serial_s3_bucket)) for _ in range(8)]
    made = await asyncio.gather(*(ensure_incarnation(store) for store in stores))
    assert len(set(made)) == 1


async def test_a_bucket_started_afresh_has_a_new_incarnation_that_old_watches_cannot_follow(
    s3_bucket: S3Bucket,
) -> None:
    async with serve_store(s3_bucket, **QUICK_HEARTBEATS) as server:
        for seed in range(3):
            await push(server.stub, "old", tiny_adapter(seed=seed))
        before = await server.stub.ListAdapters(pb.ListAdaptersRequest())
    _empty(s3_bucket)
    async with serve_store(s3_bucket, **QUICK_HEARTBEATS) as server:
        await push(server.stub, "new", tiny_adapter())
        after = await server.stub.ListAdapters(pb.ListAdaptersRequest())
        behind = await _watch_code(
            server.stub, pb.WatchAdaptersRequest(after_seq=0, incarnation=before.incarnation)
        )
        beyond = await _watch_code(server.stub, pb.WatchAdaptersRequest(after_seq=before.seq))
        current = await _first_message(
            server.stub, pb.WatchAdaptersRequest(after_seq=0, incarnation=after.incarnation)
        )
    assert (before.seq, after.seq) == (3, 1)
    assert after.incarnation not in ("", before.incarnation)
    assert behind == beyond == grpc.StatusCode.OUT_OF_RANGE
    assert current.event.adapter_name == "new"


async def test_an_open_watch_ends_out_of_range_when_its_bucket_is_emptied(
    s3_bucket: S3Bucket,
) -> None:
    async with serve_store(s3_bucket, **QUICK_HEARTBEATS) as server:
        await push(server.stub, "a", tiny_adapter())
        before = await server.stub.ListAdapters(pb.ListAdaptersRequest())
        call = server.stub.WatchAdapters(
            pb.WatchAdaptersRequest(after_seq=1, incarnation=before.incarnation), timeout=GUARD_S
        )
        assert (await call.read()).HasField("heartbeat")
        _empty(s3_bucket)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _heartbeats_until_the_end(call)
        after = await server.stub.ListAdapters(pb.ListAdaptersRequest())
    assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert (after.seq, list(after.adapters)) == (0, [])
    assert after.incarnation not in ("", before.incarnation)


async def test_an_adapter_deleted_and_pushed_again_has_a_new_create_seq(
    s3_bucket: S3Bucket,
) -> None:
    async with serve_store(s3_bucket) as server:
        first = await push(server.stub, "x", tiny_adapter())
        await push(server.stub, "x", tiny_adapter(seed=1))
        before = await server.stub.GetAdapter(pb.GetAdapterRequest(name="x"))
        await server.stub.DeleteAdapter(pb.DeleteAdapterRequest(name="x"))
        again = await push(server.stub, "x", tiny_adapter(seed=2))
        after = await server.stub.GetAdapter(pb.GetAdapterRequest(name="x"))
        listed = await server.stub.ListAdapters(pb.ListAdaptersRequest())
    assert before.adapter.create_seq == first.seq == 1
    assert after.adapter.create_seq == again.seq == 4
    assert listed.adapters[0].create_seq == 4
    assert again.revision.revision == 3
