"""What a push leaves in the bucket when it does not go through, and what a retry of a
committed push uploads (issue 29, items 6 and 18): real gRPC on 127.0.0.1, S3 over
real HTTP (moto's server), through a proxy that sees every request."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from safetensors.numpy import save

from loraserve.adapterstore import store as store_module
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import AdapterFiles, lora_config, lora_tensors, tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import S3FaultProxy
from loraserve.testing.store.calls import keys_under, push
from loraserve.testing.store.server import serve_store
from loraserve.testing.waiting import GUARD_S, eventually

KEY = "0b5e2c8e-7f52-4a4b-9a39-1f1d4f3c2a10"


def _big_adapter() -> AdapterFiles:
    """About 12 MiB of weights: more than two S3 parts of the test's 5 MiB."""
    tensors = lora_tensors(rank=64, layers=6, hidden=2048)
    return {"adapter_config.json": lora_config(64), "adapter_model.safetensors": save(tensors)}


def _parts(bucket: S3Bucket) -> list[int]:
    """Part numbers sent to the bucket's incomplete multipart uploads."""
    client = bucket.client()
    return [
        part["PartNumber"]
        for upload in client.list_multipart_uploads(Bucket=bucket.bucket).get("Uploads", [])
        for part in client.list_parts(
            Bucket=bucket.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
        ).get("Parts", [])
    ]


def _writes(fault_proxy: S3FaultProxy) -> list[tuple[str, str]]:
    """Requests that would store bytes of a push: uploads and staged objects."""
    return [
        (method, key)
        for method, key in fault_proxy.requests
        if method in ("PUT", "POST") and key.startswith(("blobs/", "tmp/"))
    ]


@pytest.mark.parametrize("declare_sha256", [True, False], ids=["sha256-declared", "undeclared"])
async def test_push_cancelled_after_its_first_part_leaves_no_multipart_upload(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture, declare_sha256: bool
) -> None:
    caplog.set_level(logging.INFO, logger="loraserve.adapterstore.blobs.s3upload")
    files = _big_adapter()
    requests = list(push_requests("big", files, declare_sha256=declare_sha256))
    async with serve_store(s3_bucket) as server:
        # Tries that cancel at different points: as soon as the upload exists, once a
        # part has landed, with more or less of the next part received.
        for attempt in range(6):
            call = server.stub.PushAdapter(timeout=GUARD_S)
            sent = 0
            for request in requests:
                await call.write(request)
                sent += len(request.chunk.data)
                if sent > (6 + attempt // 2) * 1024 * 1024:
                    break
            await eventually(lambda: bool(s3_bucket.multipart_uploads()), "an upload started")
            if attempt % 2:
                await eventually(lambda: bool(_parts(s3_bucket)), "a part landed")
            call.cancel()
            await eventually(lambda: not s3_bucket.multipart_uploads(), "the upload was aborted")
        listed = await server.stub.ListAdapters(pb.ListAdaptersRequest())
    assert list(listed.adapters) == []
    assert "blob.upload_aborted" in caplog.text
    assert keys_under(s3_bucket.keys(), "tmp/") == keys_under(s3_bucket.keys(), "blobs/") == []


def _start_upload(bucket: S3Bucket, key: str) -> None:
    """An incomplete multipart upload with one part sent now."""
    client = bucket.client()
    upload = client.create_multipart_upload(Bucket=bucket.bucket, Key=key)
    client.upload_part(
        Bucket=bucket.bucket, Key=key, UploadId=upload["UploadId"], PartNumber=1, Body=b"part"
    )


async def test_start_up_sweeps_uploads_older_than_the_bound(s3_bucket: S3Bucket) -> None:
    _start_upload(s3_bucket, "blobs/sha256/" + "a" * 64)
    _start_upload(s3_bucket, "tmp/left-by-a-killed-push")
    s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key="tmp/staged", Body=b"x")
    # Older than the bound: the store starts after every part was sent.
    await asyncio.sleep(0.01)
    async with serve_store(s3_bucket, stale_upload_age_s=0.001) as server:
        await eventually(lambda: not s3_bucket.multipart_uploads(), "the uploads were aborted")
        await eventually(lambda: keys_under(s3_bucket.keys(), "tmp/") == [], "tmp/ was swept")
        pushed = await push(server.stub, "a", tiny_adapter())
    assert pushed.revision.revision == 1


def _last_part_sent(bucket: S3Bucket, key: str) -> datetime:
    """When the last part of the upload of `key` arrived: the age the sweep reads, as
    moto gives every upload one fixed `Initiated` date (see s3sweep)."""
    client = bucket.client()
    uploads = client.list_multipart_uploads(Bucket=bucket.bucket).get("Uploads", [])
    upload_id = next(u["UploadId"] for u in uploads if u["Key"] == key)
    parts = client.list_parts(Bucket=bucket.bucket, Key=key, UploadId=upload_id)["Parts"]
    sent: datetime = max(part["LastModified"] for part in parts)
    return sent


async def test_start_up_keeps_uploads_younger_than_the_bound(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="loraserve.adapterstore")
    abandoned, in_progress = "tmp/abandoned-an-hour-ago", "tmp/in-progress-elsewhere"
    _start_upload(s3_bucket, abandoned)
    left_at = _last_part_sent(s3_bucket, abandoned)
    # S3 may give the time a part arrived to the second only: the other upload's part
    # must arrive in a later second for the two to fall on either side of a cutoff.
    await eventually(lambda: datetime.now(UTC) >= left_at + timedelta(seconds=1), "a second passed")
    _start_upload(s3_bucket, in_progress)
    sent_at = _last_part_sent(s3_bucket, in_progress)
    assert sent_at > left_at
    # The store starts an hour after a moment between the two: one upload is past the
    # bound, the other within it. Without one past it, nothing would show the sweep ran.
    start_up = left_at + (sent_at - left_at) / 2 + timedelta(seconds=3600)
    monkeypatch.setattr(store_module, "now", lambda: start_up)
    async with serve_store(s3_bucket, stale_upload_age_s=3600) as server:
        await eventually(
            lambda: abandoned not in s3_bucket.multipart_uploads(), "the sweep aborted one"
        )
        await push(server.stub, "a", tiny_adapter())
        await server.stub.ListAdapters(pb.ListAdaptersRequest())
    assert s3_bucket.multipart_uploads() == [in_progress]
    assert f"blob.stale_upload_aborted key={abandoned}" in caplog.text
    assert f"blob.stale_upload_aborted key={in_progress}" not in caplog.text


async def test_retry_of_a_committed_push_is_answered_from_its_header(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy
) -> None:
    files = _big_adapter()
    header = next(push_requests("big", files, idempotency_key=KEY))
    async with serve_store(replace(s3_bucket, endpoint_url=fault_proxy.endpoint_url)) as server:
        first = await push(server.stub, "big", files, idempotency_key=KEY)
        fault_proxy.requests.clear()
        call = server.stub.PushAdapter(timeout=GUARD_S)
        await call.write(header)
        # Not one chunk sent, the stream still open: the answer needs none of them.
        async with asyncio.timeout(GUARD_S):
            retried = await call
        listed = await server.stub.ListRevisions(pb.ListRevisionsRequest(name="big"))
    assert (retried.revision, retried.seq) == (first.revision, first.seq)
    assert [r.revision for r in listed.revisions] == [1]
    assert _writes(fault_proxy) == []


async def test_retry_of_a_committed_push_without_sha256s_uploads_nothing(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy
) -> None:
    files = _big_adapter()
    async with serve_store(replace(s3_bucket, endpoint_url=fault_proxy.endpoint_url)) as server:
        first = await push(server.stub, "big", files, idempotency_key=KEY, declare_sha256=False)
        fault_proxy.requests.clear()
        retried = await push(server.stub, "big", files, idempotency_key=KEY, declare_sha256=False)
        other = tiny_adapter(seed=3)
        reused = await _push_code(server.stub, other, declare_sha256=False)
    assert (retried.revision, retried.seq) == (first.revision, first.seq)
    assert reused == "INVALID_ARGUMENT"
    assert _writes(fault_proxy) == []


async def _push_code(stub: object, files: AdapterFiles, **header: object) -> str:
    try:
        await push(stub, "big", files, idempotency_key=KEY, **header)
    except grpc.aio.AioRpcError as e:
        return e.code().name
    return "OK"
