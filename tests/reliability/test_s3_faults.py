"""Rows 2 and 3, store side: S3 connections cut mid-upload and mid-read, and a
committed blob corrupted in S3.

The store runs in-process over real gRPC, talking to the moto S3 server through
a fault proxy that cuts connections part-way through a request or response body.
"""

from __future__ import annotations

import hashlib
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.processes.services import health_status
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.calls import keys_under, push, store_stub
from loraserve.testing.store.server import RunningStore

pytestmark = pytest.mark.faults

WEIGHTS = "adapter_model.safetensors"


async def _download_into(stub: Any, name: str, files: dict[str, bytearray]) -> pb.Revision:
    """Downloads `name`, adding each chunk to `files` as it arrives."""
    manifest = pb.Revision()
    async for message in stub.DownloadAdapter(pb.DownloadAdapterRequest(name=name), timeout=30):
        if message.HasField("manifest"):
            manifest = message.manifest
        else:
            files.setdefault(message.chunk.file_name, bytearray()).extend(message.chunk.data)
    return manifest


async def _download(stub: Any, name: str) -> tuple[pb.Revision, dict[str, bytes]]:
    files: dict[str, bytearray] = {}
    manifest = await _download_into(stub, name, files)
    return manifest, {name: bytes(data) for name, data in files.items()}


async def test_push_with_every_s3_upload_cut_fails_unavailable_and_commits_nothing(
    proxied_store: RunningStore,
    fault_proxy: S3FaultProxy,
    s3_bucket: S3Bucket,
    pytestconfig: pytest.Config,
) -> None:
    before = s3_bucket.keys()
    # Every PUT: each upload of the push, whatever key layout the blob store uses.
    cut = fault_proxy.add(Fault.CUT_REQUEST, "PUT", "", after_bytes=100)
    async with store_stub(proxied_store.address) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await push(stub, "cut", tiny_adapter())
        listed = await stub.ListAdapters(pb.ListAdaptersRequest())
    add_figure(pytestconfig, "faults.s3_cuts_mid_push", cut.hits)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "object storage" in (caught.value.details() or "")
    assert cut.hits >= 2  # boto3 retried before giving up
    assert (list(listed.adapters), listed.seq) == ([], 0)
    assert s3_bucket.keys() == before
    assert await health_status(proxied_store.address) == health_pb2.HealthCheckResponse.SERVING


async def test_push_with_one_s3_upload_cut_is_retried_and_commits_once(
    proxied_store: RunningStore,
    fault_proxy: S3FaultProxy,
    s3_bucket: S3Bucket,
    pytestconfig: pytest.Config,
) -> None:
    # The push's first PUT is one of its uploads, whatever key layout the blob store uses.
    cut = fault_proxy.add(Fault.CUT_REQUEST, "PUT", "", after_bytes=100, times=1)
    files = tiny_adapter()
    before = set(s3_bucket.keys())
    async with store_stub(proxied_store.address) as stub:
        pushed = await push(stub, "cut-once", files)
        _, downloaded = await _download(stub, "cut-once")
    add_figure(pytestconfig, "faults.s3_cuts_mid_push", cut.hits)
    assert cut.hits == 1
    assert (pushed.revision.revision, pushed.seq) == (1, 1)
    assert downloaded == files
    assert set(s3_bucket.keys()) - before == {
        *(blob_key(hashlib.sha256(data).hexdigest()) for data in files.values()),
        *keys_under(s3_bucket.keys(), "log/"),
    }
    assert len(keys_under(s3_bucket.keys(), "log/")) == 1


async def test_download_with_s3_read_cut_ends_unavailable_and_the_next_download_is_whole(
    proxied_store: RunningStore, fault_proxy: S3FaultProxy, pytestconfig: pytest.Config
) -> None:
    files = tiny_adapter()
    async with store_stub(proxied_store.address) as stub:
        await push(stub, "read-cut", files)
        weights_key = blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())
        fault_proxy.add(Fault.CUT_RESPONSE, "GET", weights_key, after_bytes=2000, times=1)
        add_figure(pytestconfig, "faults.s3_cuts_mid_download")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _download(stub, "read-cut")
        _, downloaded = await _download(stub, "read-cut")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert downloaded == files


async def test_corrupted_blob_download_ends_with_data_loss_naming_the_file(
    store_server: RunningStore, s3_bucket: S3Bucket
) -> None:
    files = tiny_adapter()
    async with store_stub(store_server.address) as stub:
        await push(stub, "corrupt", files)
        key = blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())
        flipped = bytearray(files[WEIGHTS])
        flipped[-1] ^= 0x01
        s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=key, Body=bytes(flipped))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _download(stub, "corrupt")
    assert caught.value.code() == grpc.StatusCode.DATA_LOSS
    assert WEIGHTS in (caught.value.details() or "")
    assert "corrupt" in (caught.value.details() or "")


async def test_corrupted_blob_never_reaches_the_client_whole(
    store_server: RunningStore, s3_bucket: S3Bucket
) -> None:
    """The store holds back a file's last chunk until its sha256 is checked."""
    files = tiny_adapter()
    received: dict[str, bytearray] = {}
    async with store_stub(store_server.address) as stub:
        await push(stub, "held-back", files)
        key = blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())
        flipped = bytearray(files[WEIGHTS])
        flipped[100] ^= 0xFF
        s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=key, Body=bytes(flipped))
        with pytest.raises(grpc.aio.AioRpcError):
            await _download_into(stub, "held-back", received)
    assert len(received.get(WEIGHTS, b"")) < len(files[WEIGHTS])


async def test_store_stays_serving_other_adapters_after_a_corrupt_download(
    store_server: RunningStore, s3_bucket: S3Bucket
) -> None:
    good, bad = tiny_adapter(seed=1), tiny_adapter(seed=2)
    async with store_stub(store_server.address) as stub:
        await push(stub, "good", good)
        await push(stub, "bad", bad)
        key = blob_key(hashlib.sha256(bad[WEIGHTS]).hexdigest())
        s3_bucket.client().put_object(Bucket=s3_bucket.bucket, Key=key, Body=b"\0" * 64)
        with pytest.raises(grpc.aio.AioRpcError):
            await _download(stub, "bad")
        _, downloaded = await _download(stub, "good")
    assert downloaded == good
    assert await health_status(store_server.address) == health_pb2.HealthCheckResponse.SERVING
