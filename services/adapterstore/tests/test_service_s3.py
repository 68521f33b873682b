"""The store end to end: real gRPC on 127.0.0.1, S3 over real HTTP (moto's server)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from safetensors.numpy import save

from loraserve.adapterstore.changelog.log import LogSettings
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.testing.adapters.badpushes import BAD_PUSHES, BadPush
from loraserve.testing.adapters.files import AdapterFiles, lora_config, lora_tensors, tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import keys_under
from loraserve.testing.store.server import StoreServer, serve_store
from loraserve.testing.store.statuses import report_request
from loraserve.testing.waiting import GUARD_S


async def _push(
    stub: pb_grpc.AdapterStoreServiceStub, name: str, files: AdapterFiles, **header: Any
) -> pb.PushAdapterResponse:
    response: pb.PushAdapterResponse = await stream_unary(
        stub.PushAdapter, push_requests(name, files, **header)
    )
    return response


async def _download(
    stub: pb_grpc.AdapterStoreServiceStub, name: str, revision: int = 0
) -> tuple[pb.Revision, AdapterFiles]:
    manifest = pb.Revision()
    files: dict[str, bytearray] = {}
    async for message in stub.DownloadAdapter(
        pb.DownloadAdapterRequest(name=name, revision=revision)
    ):
        if message.HasField("manifest"):
            manifest = message.manifest
        else:
            files.setdefault(message.chunk.file_name, bytearray()).extend(message.chunk.data)
    return manifest, {k: bytes(v) for k, v in files.items()}


async def _events(
    stub: pb_grpc.AdapterStoreServiceStub, after_seq: int, count: int
) -> list[pb.AdapterEvent]:
    events: list[pb.AdapterEvent] = []
    call = stub.WatchAdapters(pb.WatchAdaptersRequest(after_seq=after_seq))
    try:
        async with asyncio.timeout(GUARD_S):
            async for message in call:
                if message.HasField("event"):
                    events.append(message.event)
                    if len(events) == count:
                        return events
    finally:
        call.cancel()
    raise AssertionError("watch ended early")


@pytest.fixture
async def server(s3_bucket: S3Bucket):  # type: ignore[no-untyped-def]
    async with serve_store(s3_bucket) as running:
        yield running


@pytest.fixture(scope="module")
async def seeded_server(module_s3_bucket: S3Bucket) -> AsyncIterator[StoreServer]:
    """A store holding adapter `good`, shared by the bad pushes: each is refused and
    checks the bucket against what it held before."""
    async with serve_store(module_s3_bucket) as running:
        await _push(running.stub, "good", tiny_adapter())
        yield running


def _big_adapter() -> AdapterFiles:
    """About 12 MiB of weights: more than two S3 parts of the test's 5 MiB."""
    tensors = lora_tensors(rank=64, layers=6, hidden=2048)
    return {"adapter_config.json": lora_config(64), "adapter_model.safetensors": save(tensors)}


@pytest.mark.parametrize("declare_sha256", [True, False], ids=["sha256-declared", "undeclared"])
async def test_push_then_list_get_and_download_byte_identical(
    server: StoreServer, s3_bucket: S3Bucket, declare_sha256: bool
) -> None:
    files = _big_adapter() | {"README.md": b"# big"}
    pushed = await _push(
        server.stub, "big", files, description="first", declare_sha256=declare_sha256
    )
    listed = await server.stub.ListAdapters(pb.ListAdaptersRequest())
    revisions = await server.stub.ListRevisions(pb.ListRevisionsRequest(name="big"))
    got = await server.stub.GetAdapter(pb.GetAdapterRequest(name="big"))
    manifest, downloaded = await _download(server.stub, "big")
    assert (pushed.revision.revision, pushed.promoted, pushed.seq) == (1, True, 1)
    assert [a.name for a in listed.adapters] == ["big"]
    assert listed.seq == 1
    assert [r.revision for r in revisions.revisions] == [1]
    assert got.revision == pushed.revision == manifest
    assert (manifest.rank, manifest.alpha, manifest.description) == (64, 128.0, "first")
    assert downloaded == files
    for info in manifest.files:
        assert info.sha256 == hashlib.sha256(files[info.name]).hexdigest()
        assert info.size == len(files[info.name])
    assert keys_under(s3_bucket.keys(), "tmp/") == []
    assert s3_bucket.multipart_uploads() == []


async def test_push_of_stored_content_adds_no_blob(
    server: StoreServer, s3_bucket: S3Bucket
) -> None:
    files = _big_adapter()
    await _push(server.stub, "first", files)
    blobs = keys_under(s3_bucket.keys(), "blobs/")
    pushed = await _push(server.stub, "second", files)
    _, downloaded = await _download(server.stub, "second")
    assert pushed.revision.revision == 1
    assert downloaded == files
    assert keys_under(s3_bucket.keys(), "blobs/") == blobs
    assert s3_bucket.multipart_uploads() == []


async def test_ten_concurrent_pushes_through_two_stores_number_revisions_one_to_ten(
    serial_s3_bucket: S3Bucket,
) -> None:
    async with serve_store(serial_s3_bucket) as a, serve_store(serial_s3_bucket) as b:
        results = await asyncio.gather(
            *(_push((a, b)[i % 2].stub, "race", tiny_adapter(seed=i)) for i in range(10))
        )
        listed = await b.stub.ListRevisions(pb.ListRevisionsRequest(name="race"))
    assert sorted(r.revision.revision for r in results) == list(range(1, 11))
    assert sorted(r.seq for r in results) == list(range(1, 11))
    assert [r.revision for r in listed.revisions] == list(range(10, 0, -1))


@pytest.mark.parametrize("declare_sha256", [True, False], ids=["sha256-declared", "undeclared"])
@pytest.mark.parametrize("case", BAD_PUSHES, ids=lambda c: c.id)
async def test_bad_push_is_invalid_argument_and_leaves_bucket_unchanged(
    case: BadPush, declare_sha256: bool, seeded_server: StoreServer, module_s3_bucket: S3Bucket
) -> None:
    before = module_s3_bucket.keys()
    header = pb.PushAdapterRequest(
        header=pb.PushHeader(
            name="bad",
            files=[
                pb.FileInfo(name=f.name, size=f.size, sha256=f.sha256) for f in case.header_files
            ]
            if case.header_files is not None
            else [
                pb.FileInfo(
                    name=n,
                    size=len(d),
                    sha256=hashlib.sha256(d).hexdigest() if declare_sha256 else "",
                )
                for n, d in case.files.items()
            ],
        )
    )
    if case.chunks is not None:
        requests = [header] + [
            pb.PushAdapterRequest(
                chunk=pb.FileChunk(file_name=c.file_name, offset=c.offset, data=c.data)
            )
            for c in case.chunks
        ]
    else:
        requests = [header, *list(push_requests("bad", case.files))[1:]]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream_unary(seeded_server.stub.PushAdapter, requests)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert case.message in (caught.value.details() or "")
    assert module_s3_bucket.keys() == before
    assert module_s3_bucket.multipart_uploads() == []


async def test_watch_resumed_from_last_seq_gets_each_missed_change_once_in_order(
    server: StoreServer,
) -> None:
    await _push(server.stub, "w", tiny_adapter())
    seen = await _events(server.stub, 0, 1)
    await _push(server.stub, "w", tiny_adapter(seed=1))
    await server.stub.SetCurrentRevision(pb.SetCurrentRevisionRequest(name="w", revision=1))
    await server.stub.DeleteAdapter(pb.DeleteAdapterRequest(name="w"))
    missed = await _events(server.stub, seen[-1].seq, 3)
    assert [e.seq for e in missed] == [2, 3, 4]
    assert [e.type for e in missed] == [
        pb.EVENT_TYPE_REVISION_PUSHED,
        pb.EVENT_TYPE_CURRENT_REVISION_SET,
        pb.EVENT_TYPE_ADAPTER_DELETED,
    ]
    assert [e.current_revision for e in missed] == [2, 1, 0]


async def test_watch_behind_kept_log_ends_with_out_of_range(s3_bucket: S3Bucket) -> None:
    retention = LogSettings(poll_interval=0.05, snapshot_every=2, log_retention=1, memory_events=1)
    async with serve_store(s3_bucket, retention) as running:
        for seed in range(4):
            await _push(running.stub, "old", tiny_adapter(seed=seed))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _events(running.stub, 0, 1)
    assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "list adapters" in (caught.value.details() or "")


async def test_commits_of_another_store_reach_this_stores_watchers(s3_bucket: S3Bucket) -> None:
    async with serve_store(s3_bucket) as watcher, serve_store(s3_bucket) as writer:
        watching = asyncio.create_task(_events(watcher.stub, 0, 2))
        await _push(writer.stub, "x", tiny_adapter())
        await _push(writer.stub, "x", tiny_adapter(seed=1))
        events = await watching
    assert [(e.seq, e.revision.revision) for e in events] == [(1, 1), (2, 2)]


def _replica_report(name: str, *revisions: pb.RevisionStatus) -> pb.ReportReplicaStatusRequest:
    """inference-0's report of `name`, serving its revision 1."""
    report = pb.AdapterReport(serving_revision=1, revisions=revisions)
    return report_request("inference-0", {name: report})


async def test_replica_status_reported_to_one_store_is_read_from_another(
    s3_bucket: S3Bucket,
) -> None:
    async with serve_store(s3_bucket) as a, serve_store(s3_bucket) as b:
        for seed in range(2):
            await _push(a.stub, "x", tiny_adapter(seed=seed))
        routed = pb.RevisionStatus(revision=1, state=pb.REVISION_SERVING_STATE_ROUTED)
        first = await a.stub.ReportReplicaStatus(_replica_report("x", routed))
        after_route = await b.stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="x"))
        nack = pb.RevisionStatus(
            revision=2,
            state=pb.REVISION_SERVING_STATE_FAILED,
            error=pb.ErrorStatus(code=9, message="rank 64 > max_lora_rank 16"),
        )
        second = await b.stub.ReportReplicaStatus(_replica_report("x", routed, nack))
        after_nack = await a.stub.GetAdapterStatus(pb.GetAdapterStatusRequest())
    assert (first.known, second.known) == (False, True)
    (status,) = after_route.statuses
    assert (status.replica_id, status.liveness, status.serving_revision) == (
        "inference-0",
        pb.REPLICA_LIVENESS_LIVE,
        1,
    )
    assert [(r.revision, r.state) for r in status.revisions] == [
        (1, pb.REVISION_SERVING_STATE_ROUTED)
    ]
    (status,) = after_nack.statuses
    assert [(r.revision, r.state, r.error.code) for r in status.revisions] == [
        (1, pb.REVISION_SERVING_STATE_ROUTED, 0),
        (2, pb.REVISION_SERVING_STATE_FAILED, 9),
    ]
    assert (status.type, status.last_error.message) == (
        pb.REPORT_TYPE_NACK,
        "rank 64 > max_lora_rank 16",
    )


async def test_single_adapter_report_of_an_earlier_replica_is_refused_naming_the_upgrade(
    server: StoreServer,
) -> None:
    await _push(server.stub, "x", tiny_adapter())
    report = pb.ReportStatusRequest(
        replica_id="inference-0", adapter_name="x", revision=1, type=pb.REPORT_TYPE_ACK
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.stub.ReportStatus(report)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "ReportReplicaStatus" in str(caught.value.details())


async def test_download_of_unknown_adapter_is_not_found(server: StoreServer) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _download(server.stub, "ghost")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_set_current_with_stale_expectation_is_aborted(server: StoreServer) -> None:
    await _push(server.stub, "y", tiny_adapter())
    await _push(server.stub, "y", tiny_adapter(seed=1))
    request = pb.SetCurrentRevisionRequest(name="y", revision=1, expected_current_revision=1)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.stub.SetCurrentRevision(request)
    assert caught.value.code() == grpc.StatusCode.ABORTED


async def test_restarted_store_serves_what_was_committed(s3_bucket: S3Bucket) -> None:
    async with serve_store(s3_bucket) as first:
        await _push(first.stub, "z", tiny_adapter())
    async with serve_store(s3_bucket) as second:
        _, files = await _download(second.stub, "z")
    assert files == tiny_adapter()


async def test_empty_push_stream_is_invalid_argument(server: StoreServer) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stream_unary(server.stub.PushAdapter, [])
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
