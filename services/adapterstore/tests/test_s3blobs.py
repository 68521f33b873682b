"""S3BlobStore against a real S3 HTTP endpoint (moto's server)."""

from __future__ import annotations

import hashlib
import os

import pytest

from loraserve.adapterstore.blobstore import BlobNotFound, blob_key
from loraserve.adapterstore.s3blobs import MIN_PART_SIZE, S3BlobStore, S3Location
from loraserve.testing.s3 import S3Bucket


def _store(bucket: S3Bucket, prefix: str = "store") -> S3BlobStore:
    location = S3Location(
        bucket=bucket.bucket,
        prefix=prefix,
        endpoint_url=bucket.endpoint_url,
        region=bucket.region,
        access_key_id=bucket.access_key_id,
        secret_access_key=bucket.secret_access_key,
    )
    return S3BlobStore(location, part_size=MIN_PART_SIZE)


async def test_multipart_upload_keeps_content_at_its_sha256(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    data = os.urandom(2 * MIN_PART_SIZE + 12345)
    upload = await store.start_upload()
    for start in range(0, len(data), 1024 * 1024):
        await upload.write(data[start : start + 1024 * 1024])
    staged = await upload.finish()
    key = await store.keep(staged)
    assert (staged.sha256, staged.size) == (hashlib.sha256(data).hexdigest(), len(data))
    assert await store.get(key) == data
    assert s3_bucket.keys() == [f"store/{key}"]


async def test_keeping_identical_content_twice_leaves_one_blob(s3_bucket: S3Bucket) -> None:
    store = _store(s3_bucket)
    for _ in range(2):
        upload = await store.start_upload()
        await upload.write(b"same bytes")
        await store.keep(await upload.finish())
    assert s3_bucket.keys() == [f"store/{blob_key(hashlib.sha256(b'same bytes').hexdigest())}"]


async def test_aborted_upload_leaves_no_object_and_no_multipart_upload(
    s3_bucket: S3Bucket,
) -> None:
    store = _store(s3_bucket)
    upload = await store.start_upload()
    await upload.write(os.urandom(MIN_PART_SIZE + 1))
    await upload.abort()
    assert s3_bucket.keys() == []
    uploads = s3_bucket.client().list_multipart_uploads(Bucket=s3_bucket.bucket)
    assert uploads.get("Uploads", []) == []


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
