"""S3BlobStore against a real S3 HTTP endpoint (moto's server)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from loraserve.adapterstore.blobs.blobstore import BlobNotFound, BlobUpload, blob_key
from loraserve.adapterstore.blobs.s3blobs import DEFAULT_HELD_BYTES, MIN_PART_SIZE, S3BlobStore
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.partcount import PartsOnTheWire
from loraserve.testing.store.stores import s3_location


def _store(bucket: S3Bucket, prefix: str = "store") -> S3BlobStore:
    return S3BlobStore(s3_location(bucket, prefix), part_size=MIN_PART_SIZE)


async def _write(upload: BlobUpload, data: bytes) -> None:
    for start in range(0, len(data), 1024 * 1024):
        await upload.write(data[start : start + 1024 * 1024])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_multipart_upload_keeps_content_at_its_sha256(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    data = os.urandom(2 * MIN_PART_SIZE + 12345)
    upload = await store.start_upload()
    await _write(upload, data)
    received = await upload.finish()
    key = await upload.keep()
    assert (received.sha256, received.size) == (_sha256(data), len(data))
    assert await store.get(key) == data
    assert s3_bucket.keys() == [f"store/{key}"]


async def test_keeping_identical_content_twice_leaves_one_blob(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    for _ in range(2):
        upload = await store.start_upload()
        await upload.write(b"same bytes")
        await upload.finish()
        await upload.keep()
    assert s3_bucket.keys() == [f"store/{blob_key(_sha256(b'same bytes'))}"]


async def test_aborted_upload_leaves_no_object_and_no_multipart_upload(
    s3_bucket: S3Bucket,
) -> None:
    store = _store(s3_bucket)
    upload = await store.start_upload()
    await upload.write(os.urandom(MIN_PART_SIZE + 1))
    await upload.abort()
    assert s3_bucket.keys() == []
    assert s3_bucket.multipart_uploads() == []


async def test_declared_upload_is_invisible_until_kept_at_its_sha256(
    s3_bucket: S3Bucket,
) -> None:
    store = _store(s3_bucket)
    data = os.urandom(3 * MIN_PART_SIZE + 12345)
    upload = await store.start_upload(_sha256(data))
    await _write(upload, data)
    received = await upload.finish()
    keys_before_keep = s3_bucket.keys()
    key = await upload.keep()
    assert keys_before_keep == []
    assert (received.sha256, received.size, key) == (
        _sha256(data),
        len(data),
        blob_key(received.sha256),
    )
    assert await store.get(key) == data
    assert s3_bucket.keys() == [f"store/{key}"]
    assert s3_bucket.multipart_uploads() == []


async def test_declared_upload_of_other_bytes_is_never_kept(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    data = os.urandom(MIN_PART_SIZE + 1)
    upload = await store.start_upload(_sha256(b"something else"))
    await _write(upload, data)
    received = await upload.finish()
    with pytest.raises(RuntimeError, match="refusing to keep"):
        await upload.keep()
    await upload.abort()
    assert received.sha256 == _sha256(data)
    assert s3_bucket.keys() == []
    assert s3_bucket.multipart_uploads() == []


async def test_aborted_declared_upload_leaves_no_object_and_no_multipart_upload(
    s3_bucket: S3Bucket,
) -> None:
    store = _store(s3_bucket)
    data = os.urandom(2 * MIN_PART_SIZE)
    upload = await store.start_upload(_sha256(data))
    await _write(upload, data)
    await upload.finish()
    await upload.abort()
    assert s3_bucket.keys() == []
    assert s3_bucket.multipart_uploads() == []


async def test_declared_upload_of_a_stored_blob_sends_no_bytes_but_hashes_them(
    s3_bucket: S3Bucket,
) -> None:
    store = _store(s3_bucket)
    data = os.urandom(MIN_PART_SIZE + 1)
    first = await store.start_upload(_sha256(data))
    await _write(first, data)
    await first.finish()
    await first.keep()
    second = await store.start_upload(_sha256(data))
    # Flipping a bit of the last byte: random data may already end in any given byte.
    await _write(second, data[:-1] + bytes([data[-1] ^ 1]))
    received = await second.finish()
    uploads_while_receiving = s3_bucket.multipart_uploads()
    with pytest.raises(RuntimeError, match="refusing to keep"):
        await second.keep()
    await second.abort()
    assert uploads_while_receiving == []
    assert received.sha256 != _sha256(data)
    assert await store.get(blob_key(_sha256(data))) == data


@pytest.mark.parametrize("size", [0, 10], ids=["empty", "small"])
async def test_declared_file_smaller_than_a_part_is_kept(s3_bucket: S3Bucket, size: int) -> None:
    store = _store(s3_bucket)
    data = os.urandom(size)
    upload = await store.start_upload(_sha256(data))
    await upload.write(data)
    await upload.finish()
    keys_before_keep = s3_bucket.keys()
    key = await upload.keep()
    assert keys_before_keep == []
    assert await store.get(key) == data


def _operations(store: S3BlobStore) -> list[str]:
    """The S3 operations the store's client makes from now on, in order."""
    made: list[str] = []

    def record(model: Any, **_: Any) -> None:
        made.append(model.name)

    store.client.meta.events.register("before-call.s3.*", record)
    return made


async def test_declared_file_smaller_than_a_part_is_one_put_at_keep(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    data = os.urandom(MIN_PART_SIZE - 1)
    upload = await store.start_upload(_sha256(data))
    made = _operations(store)
    await _write(upload, data)
    await upload.finish()
    before_keep = list(made)
    await upload.keep()
    assert before_keep == []
    assert made == ["PutObject"]
    assert store.held.left == DEFAULT_HELD_BYTES


async def test_small_files_past_the_held_budget_go_multipart(s3_bucket: S3Bucket) -> None:
    store = S3BlobStore(s3_location(s3_bucket), part_size=MIN_PART_SIZE, held_bytes=150)
    files = [os.urandom(100), os.urandom(100)]
    uploads = []
    for data in files:
        upload = await store.start_upload(_sha256(data))
        await upload.write(data)
        await upload.finish()
        uploads.append(upload)
    made = _operations(store)
    keys = [await upload.keep() for upload in uploads]
    assert made == ["PutObject", "CompleteMultipartUpload"]
    assert [await store.get(key) for key in keys] == files
    assert s3_bucket.multipart_uploads() == []
    assert store.held.left == 150


async def test_aborted_held_upload_gives_its_bytes_back_and_leaves_nothing(
    s3_bucket: S3Bucket,
) -> None:
    store = _store(s3_bucket)
    data = os.urandom(1000)
    upload = await store.start_upload(_sha256(data))
    await upload.write(data)
    await upload.finish()
    held = DEFAULT_HELD_BYTES - store.held.left
    await upload.abort()
    assert held == len(data)
    assert store.held.left == DEFAULT_HELD_BYTES
    assert s3_bucket.keys() == []
    assert s3_bucket.multipart_uploads() == []


async def test_upload_sends_at_most_parts_in_flight_parts_at_once(s3_bucket: S3Bucket) -> None:
    store = S3BlobStore(s3_location(s3_bucket), part_size=MIN_PART_SIZE, parts_in_flight=2)
    on_the_wire = PartsOnTheWire(store, hold_s=0.05)
    data = os.urandom(6 * MIN_PART_SIZE)
    upload = await store.start_upload(_sha256(data))
    await _write(upload, data)
    await upload.finish()
    key = await upload.keep()
    assert 1 <= on_the_wire.most <= 2
    assert await store.get(key) == data


async def test_conditional_put_refuses_a_taken_key(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    assert await store.put_if_absent("log/1", b"first")
    assert not await store.put_if_absent("log/1", b"second")
    assert await store.get("log/1") == b"first"


async def test_stream_reads_in_bounded_chunks(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    await store.put("x", b"0123456789")
    assert [c async for c in store.stream("x", 4)] == [b"0123", b"4567", b"89"]


async def test_missing_key_is_blob_not_found(s3_bucket: S3Bucket) -> None:
    with pytest.raises(BlobNotFound):
        await _store(s3_bucket).get("nothing")


async def test_list_is_ordered_and_starts_after_a_key(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    for name in ("log/3", "log/1", "log/2", "other/1"):
        await store.put(name, b"")
    assert await store.list_keys("log/") == ["log/1", "log/2", "log/3"]
    assert await store.list_keys("log/", start_after="log/1", limit=1) == ["log/2"]


async def test_multipart_blob_carries_the_crc32_of_every_part_as_boto3_uploads(
    s3_bucket: S3Bucket,
) -> None:
    store = _store(s3_bucket)
    completed: list[dict[str, Any]] = []
    store.client.meta.events.register(
        "before-parameter-build.s3.CompleteMultipartUpload",
        lambda params, **_: completed.append(params),
    )
    data = os.urandom(2 * MIN_PART_SIZE + 12345)
    upload = await store.start_upload(_sha256(data))
    await _write(upload, data)
    await upload.finish()
    key = await upload.keep()
    head = s3_bucket.client().head_object(
        Bucket=s3_bucket.bucket, Key=f"store/{key}", ChecksumMode="ENABLED"
    )
    # Only an upload created with a checksum algorithm has one (S3 reports a composite
    # of the parts', moto the object's); S3 refuses to complete it unless every part's
    # checksum is named.
    assert "ChecksumCRC32" in head, head
    [parts] = [params["MultipartUpload"]["Parts"] for params in completed]
    assert [part["PartNumber"] for part in parts] == [1, 2, 3]
    assert all(part.get("ChecksumCRC32") for part in parts), parts
