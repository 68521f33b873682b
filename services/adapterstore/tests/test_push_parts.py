"""A push's bytes reach S3 as many multipart parts at once (issue 24, item 2): every
part in flight on the wire together, committed whole at their SHA-256, and a file
refused after some of its parts landed leaves nothing behind. Real gRPC on 127.0.0.1, S3 over
real HTTP (moto's server), through a proxy that sees every request."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import replace

import grpc
import pytest
from safetensors.numpy import save

from loraserve.adapterstore.blobs import MIN_PART_SIZE, S3BlobStore, blob_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import AdapterFiles, lora_config, lora_tensors, tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import S3FaultProxy
from loraserve.testing.s3.partcount import PartsOnTheWire
from loraserve.testing.store.calls import keys_under, push
from loraserve.testing.store.server import serve_store
from loraserve.testing.store.stores import s3_location

WEIGHTS = "adapter_model.safetensors"


def _many_parts_adapter(nan_at_end: bool = False) -> AdapterFiles:
    """About 24 MiB of weights, five parts of the tests' 5 MiB; with `nan_at_end`, the
    value stored last in the file is NaN, so it arrives after the first parts landed."""
    tensors = lora_tensors(rank=64, layers=12, hidden=2048)
    if nan_at_end:
        last = _stored_last(save(tensors))
        tensors[last].reshape(-1)[-1] = float("nan")
    return {"adapter_config.json": lora_config(64), WEIGHTS: save(tensors)}


def _stored_last(weights: bytes) -> str:
    """The tensor whose bytes end the safetensors file."""
    (length,) = struct.unpack("<Q", weights[:8])
    header = json.loads(weights[8 : 8 + length])
    header.pop("__metadata__", None)
    last: str = max(header, key=lambda name: header[name]["data_offsets"][1])
    return last


async def test_store_sends_every_part_in_flight_at_once_beyond_asyncios_thread_pool(
    s3_bucket: S3Bucket,
) -> None:
    # More than asyncio's default pool has threads (cores + 4) on machines of up to 8
    # cores, which once capped the parts on the wire whatever --parts-in-flight said.
    in_flight = 12
    store = S3BlobStore(s3_location(s3_bucket), part_size=MIN_PART_SIZE, parts_in_flight=in_flight)
    on_the_wire = PartsOnTheWire(store, hold_s=0.5)
    data = os.urandom((in_flight + 1) * MIN_PART_SIZE)
    upload = await store.start_upload(hashlib.sha256(data).hexdigest())
    for start in range(0, len(data), 1024 * 1024):
        await upload.write(data[start : start + 1024 * 1024])
    await upload.finish()
    key = await upload.keep()
    assert on_the_wire.most == in_flight
    assert await store.get(key) == data


async def test_push_in_concurrent_parts_commits_each_file_whole_at_its_sha256(
    s3_bucket: S3Bucket,
) -> None:
    files = _many_parts_adapter()
    async with serve_store(s3_bucket) as server:
        pushed = await push(server.stub, "wide", files)
    client = s3_bucket.client()
    stored = {f.name: f.sha256 for f in pushed.revision.files}
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        obj = client.get_object(Bucket=s3_bucket.bucket, Key=blob_key(digest))
        assert stored[name] == digest
        assert obj["Body"].read() == data
    weights = client.head_object(
        Bucket=s3_bucket.bucket, Key=blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())
    )
    # A multipart object's ETag ends in its part count.
    assert weights["ETag"].strip('"').endswith(f"-{-(-len(files[WEIGHTS]) // MIN_PART_SIZE)}")


async def test_push_refused_after_parts_landed_leaves_no_upload_and_no_blob(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy
) -> None:
    files = _many_parts_adapter(nan_at_end=True)
    async with serve_store(replace(s3_bucket, endpoint_url=fault_proxy.endpoint_url)) as server:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await push(server.stub, "bad", files)
        listed = await server.stub.ListAdapters(pb.ListAdaptersRequest())
    parts_sent = [
        key for method, key in fault_proxy.requests if method == "PUT" and key.startswith("blobs/")
    ]
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "NaN" in (refused.value.details() or "")
    assert len(parts_sent) >= 2
    assert list(listed.adapters) == []
    assert s3_bucket.multipart_uploads() == []
    assert keys_under(s3_bucket.keys(), "blobs/") == keys_under(s3_bucket.keys(), "tmp/") == []


async def test_push_of_a_small_adapter_puts_each_new_file_once_without_multipart(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy
) -> None:
    files = tiny_adapter()
    async with serve_store(replace(s3_bucket, endpoint_url=fault_proxy.endpoint_url)) as server:
        fault_proxy.requests.clear()
        await push(server.stub, "small", files)
    to_blobs = [(method, key) for method, key in fault_proxy.requests if key.startswith("blobs/")]
    new_files = sorted(blob_key(hashlib.sha256(data).hexdigest()) for data in files.values())
    assert sorted(key for method, key in to_blobs if method == "PUT") == new_files
    assert [method for method, _ in to_blobs if method not in {"HEAD", "PUT"}] == []
