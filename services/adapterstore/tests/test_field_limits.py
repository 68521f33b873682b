"""Every field a caller stores is bounded whatever the signature policy: what is over
its limit is INVALID_ARGUMENT naming the field and the limit, and nothing is written.
On a real store over S3 HTTP (moto), with a client keeping gRPC's default limits."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.config.textlimits import (
    MAX_ERROR_MESSAGE_BYTES,
    MAX_FILE_NAME_BYTES,
    MAX_FILES,
    MAX_REPORT_ID_BYTES,
    MAX_SIGNATURE_BYTES,
)
from loraserve.common.trust.policy import SignaturePolicy, TrustSettings
from loraserve.testing.adapters.files import AdapterFiles, tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import StoreServer, serve_store
from loraserve.testing.store.statuses import report_request, routed

MIB = 1024 * 1024


@pytest.fixture
async def server(s3_bucket: S3Bucket):  # type: ignore[no-untyped-def]
    # The default signature policy: off.
    async with serve_store(s3_bucket) as running:
        yield running


async def _refused_push(
    stub: pb_grpc.AdapterStoreServiceStub, name: str, files: AdapterFiles, **header: Any
) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.PushAdapter(push_requests(name, files, **header), timeout=60)
    return caught.value


async def _listed(stub: pb_grpc.AdapterStoreServiceStub) -> list[str]:
    page = await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=30)
    return [a.name for a in page.adapters]


async def test_push_with_a_15_mib_signature_under_policy_off_is_refused_and_commits_nothing(
    server: StoreServer, s3_bucket: S3Bucket
) -> None:
    before = s3_bucket.keys()
    error = await _refused_push(server.stub, "alpha", tiny_adapter(), signature=b"x" * (15 * MIB))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"signature is {15 * MIB} bytes; the limit is {MAX_SIGNATURE_BYTES}" in (
        error.details() or ""
    )
    assert await _listed(server.stub) == []
    assert s3_bucket.keys() == before


async def test_push_with_a_signature_just_over_64_kib_under_policy_warn_is_refused(
    s3_bucket: S3Bucket,
) -> None:
    async with serve_store(s3_bucket, trust=TrustSettings(SignaturePolicy.WARN)) as server:
        signature = b"{" * (MAX_SIGNATURE_BYTES + 1)
        error = await _refused_push(server.stub, "alpha", tiny_adapter(), signature=signature)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "signature" in (error.details() or "")
        assert await _listed(server.stub) == []


async def test_push_declaring_more_files_than_the_limit_is_refused_naming_it(
    server: StoreServer, s3_bucket: S3Bucket
) -> None:
    before = s3_bucket.keys()
    files = tiny_adapter() | {f"extra-{i:02d}.json": b"{}" for i in range(MAX_FILES - 1)}
    error = await _refused_push(server.stub, "alpha", files)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"files: {MAX_FILES + 1} declared; the limit is {MAX_FILES} files" in (
        error.details() or ""
    )
    assert await _listed(server.stub) == []
    assert s3_bucket.keys() == before


async def test_push_with_a_file_name_over_the_limit_is_refused_naming_it(
    server: StoreServer, s3_bucket: S3Bucket
) -> None:
    before = s3_bucket.keys()
    name = "n" * MAX_FILE_NAME_BYTES + ".json"
    error = await _refused_push(server.stub, "alpha", tiny_adapter() | {name: b"{}"})
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error.details() or ""
    assert "file name" in details
    assert f"the limit is {MAX_FILE_NAME_BYTES} bytes" in details
    assert await _listed(server.stub) == []
    assert s3_bucket.keys() == before


async def test_abort_reason_over_the_limit_is_refused_and_the_rollout_stays_active(
    server: StoreServer,
) -> None:
    for seed in (1, 2):
        await server.stub.PushAdapter(push_requests("alpha", tiny_adapter(seed=seed)), timeout=60)
    await server.stub.SetCurrentRevision(pb.SetCurrentRevisionRequest(name="alpha", revision=1))
    await server.stub.StartRollout(pb.StartRolloutRequest(name="alpha", revision=2, weight=10))
    reason = "r" * (MAX_ERROR_MESSAGE_BYTES + 1)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.stub.AbortRollout(pb.AbortRolloutRequest(name="alpha", reason=reason))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"reason is {len(reason)} bytes; the limit is {MAX_ERROR_MESSAGE_BYTES}" in (
        caught.value.details() or ""
    )
    rollout = await server.stub.GetRollout(pb.GetRolloutRequest(name="alpha"))
    assert rollout.rollout.state == pb.ROLLOUT_STATE_ACTIVE


async def test_report_with_an_incarnation_over_the_limit_is_refused_and_records_nothing(
    server: StoreServer,
) -> None:
    await server.stub.PushAdapter(push_requests("alpha", tiny_adapter()), timeout=60)
    request = report_request("replica-1", {"alpha": routed(1)})
    request.incarnation = "i" * (MAX_REPORT_ID_BYTES + 1)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.stub.ReportReplicaStatus(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"incarnation is {MAX_REPORT_ID_BYTES + 1} bytes; the limit is" in (
        caught.value.details() or ""
    )
    status = await server.stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="alpha"))
    assert list(status.statuses) == []


async def test_report_naming_an_adapter_twice_in_one_shard_is_refused_and_records_nothing(
    server: StoreServer,
) -> None:
    await server.stub.PushAdapter(push_requests("alpha", tiny_adapter()), timeout=60)
    request = report_request("replica-1", {"alpha": routed(1)})
    request.shards[0].adapters.append(request.shards[0].adapters[0])
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.stub.ReportReplicaStatus(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than once" in (caught.value.details() or "")
    status = await server.stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="alpha"))
    assert list(status.statuses) == []
