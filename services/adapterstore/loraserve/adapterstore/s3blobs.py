"""BlobStore on any S3-compatible endpoint (AWS, MinIO, the moto emulator) with boto3.

boto3 blocks, so every call runs in a worker thread. Uploads are multipart with
parts of `part_size` bytes: memory per upload is about one part, whatever the
file's size. Temporary keys live under `tmp/`; a process killed mid-push leaves
them (and incomplete multipart uploads) behind, so production buckets should
have a lifecycle rule expiring `tmp/` objects and incomplete multipart uploads
after a day.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import botocore.config
from botocore.exceptions import BotoCoreError, ClientError

from loraserve.adapterstore.blobstore import BlobNotFound, StagedBlob, blob_key
from loraserve.common.errors import Unavailable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger(__name__)

T = TypeVar("T")

# S3 refuses parts under 5 MiB (except the last one).
MIN_PART_SIZE = 5 * 1024 * 1024
DEFAULT_PART_SIZE = 8 * 1024 * 1024
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
# 409 ConditionalRequestConflict: AWS's answer when a concurrent conditional write
# to the same key is in flight; either way the key is not ours.
_TAKEN_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})


@dataclass(frozen=True, slots=True)
class S3Location:
    """Where and how to reach the bucket. Credentials None: boto3's default chain."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None

    def __repr__(self) -> str:
        return (
            f"S3Location(bucket={self.bucket!r}, prefix={self.prefix!r}, "
            f"endpoint_url={self.endpoint_url!r}, region={self.region!r})"
        )


def make_client(location: S3Location) -> S3Client:
    config = botocore.config.Config(
        retries={"max_attempts": 5, "mode": "standard"},
        max_pool_connections=32,
        # Path-style addressing: MinIO and emulators do not serve virtual-host buckets.
        s3={"addressing_style": "path"} if location.endpoint_url else {},
    )
    session = boto3.session.Session()
    return session.client(
        "s3",
        endpoint_url=location.endpoint_url,
        region_name=location.region,
        aws_access_key_id=location.access_key_id,
        aws_secret_access_key=location.secret_access_key,
        config=config,
    )


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3BlobStore:
    def __init__(self, location: S3Location, part_size: int = DEFAULT_PART_SIZE) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes")
        self._location = location
        self._bucket = location.bucket
        prefix = location.prefix.strip("/")
        self._prefix = f"{prefix}/" if prefix else ""
        self._part_size = part_size
        self._client = make_client(location)

    def _key(self, key: str) -> str:
        return self._prefix + key

    async def _call(self, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ClientError as e:
            code = _error_code(e)
            if code in _NOT_FOUND_CODES:
                raise BlobNotFound(str(kwargs.get("Key", what))) from e
            raise Unavailable(f"object storage: {what} failed: {code or e}") from e
        except BotoCoreError as e:
            raise Unavailable(f"object storage: {what} failed: {e}") from e

    async def check(self) -> None:
        try:
            await self._call("head_bucket", self._client.head_bucket, Bucket=self._bucket)
        except BlobNotFound:
            raise Unavailable(f"object storage: bucket {self._bucket!r} does not exist") from None

    async def start_upload(self) -> _S3Upload:
        return _S3Upload(self, f"tmp/{uuid.uuid4().hex}")

    async def keep(self, staged: StagedBlob) -> str:
        key = blob_key(staged.sha256)
        try:
            await self._call(
                "head_object", self._client.head_object, Bucket=self._bucket, Key=self._key(key)
            )
        except BlobNotFound:
            # `copy` is the managed transfer: it switches to multipart copy for large
            # objects, which a single CopyObject (5 GiB at most) cannot do.
            await self._call(
                "copy",
                self._client.copy,
                {"Bucket": self._bucket, "Key": self._key(staged.temp_key)},
                self._bucket,
                self._key(key),
            )
        await self.delete([staged.temp_key])
        return key

    async def discard(self, staged: StagedBlob) -> None:
        await self.delete([staged.temp_key])

    async def put(self, key: str, data: bytes) -> None:
        await self._call(
            "put_object",
            self._client.put_object,
            Bucket=self._bucket,
            Key=self._key(key),
            Body=data,
        )

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            await asyncio.to_thread(
                self._client.put_object,
                Bucket=self._bucket,
                Key=self._key(key),
                Body=data,
                IfNoneMatch="*",
            )
        except ClientError as e:
            if _error_code(e) in _TAKEN_CODES:
                return False
            raise Unavailable(
                f"object storage: conditional put failed: {_error_code(e) or e}"
            ) from e
        except BotoCoreError as e:
            raise Unavailable(f"object storage: conditional put failed: {e}") from e
        return True

    async def get(self, key: str) -> bytes:
        response = await self._call(
            "get_object", self._client.get_object, Bucket=self._bucket, Key=self._key(key)
        )
        body = response["Body"]
        try:
            return await self._call("read", body.read)
        finally:
            body.close()

    async def stream(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        response = await self._call(
            "get_object", self._client.get_object, Bucket=self._bucket, Key=self._key(key)
        )
        body = response["Body"]
        try:
            while chunk := await self._call("read", body.read, chunk_size):
                yield chunk
        finally:
            body.close()

    async def list_keys(self, prefix: str, start_after: str = "", limit: int = 0) -> list[str]:
        return await self._call("list_objects_v2", self._list_keys, prefix, start_after, limit)

    def _list_keys(self, prefix: str, start_after: str, limit: int) -> list[str]:
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": self._key(prefix)}
        if start_after:
            kwargs["StartAfter"] = self._key(start_after)
        keys: list[str] = []
        for page in self._client.get_paginator("list_objects_v2").paginate(**kwargs):
            for item in page.get("Contents", []):
                keys.append(item["Key"][len(self._prefix) :])
                if limit and len(keys) >= limit:
                    return keys
        return keys

    async def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            response = await self._call(
                "delete_objects",
                self._client.delete_objects,
                Bucket=self._bucket,
                Delete={"Objects": batch, "Quiet": True},
            )
            if errors := response.get("Errors"):
                raise Unavailable(f"object storage: delete failed for {len(errors)} key(s)")


class _S3Upload:
    """Hashes and uploads a file part by part; small files become one put_object."""

    def __init__(self, store: S3BlobStore, key: str) -> None:
        self._store = store
        self._client = store._client
        self._key = key
        self._buffer = bytearray()
        self._hash = hashlib.sha256()
        self._size = 0
        self._upload_id: str | None = None
        self._parts: list[CompletedPartTypeDef] = []
        self._finishing: asyncio.Future[None] | None = None
        self._completed = False

    async def write(self, data: bytes) -> None:
        self._buffer += data
        self._size += len(data)
        if len(self._buffer) >= self._store._part_size:
            part, self._buffer = self._buffer, bytearray()
            await self._store._call("upload_part", self._upload_part, bytes(part))

    def _upload_part(self, part: bytes) -> None:
        self._hash.update(part)
        full_key = self._store._key(self._key)
        if self._upload_id is None:
            created = self._client.create_multipart_upload(Bucket=self._store._bucket, Key=full_key)
            self._upload_id = created["UploadId"]
        number = len(self._parts) + 1
        response = self._client.upload_part(
            Bucket=self._store._bucket,
            Key=full_key,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=part,
        )
        self._parts.append({"ETag": response["ETag"], "PartNumber": number})

    async def finish(self) -> StagedBlob:
        part, self._buffer = bytes(self._buffer), bytearray()
        # A cancelled caller does not stop the worker thread, which may still create
        # the object; abort() waits for it and then deletes what it wrote.
        self._finishing = asyncio.ensure_future(
            self._store._call("finish_upload", self._finish, part)
        )
        await asyncio.shield(self._finishing)
        return StagedBlob(self._key, self._hash.hexdigest(), self._size)

    def _finish(self, last_part: bytes) -> None:
        full_key = self._store._key(self._key)
        if self._upload_id is None:
            self._hash.update(last_part)
            self._client.put_object(Bucket=self._store._bucket, Key=full_key, Body=last_part)
            return
        if last_part:
            self._upload_part(last_part)
        self._client.complete_multipart_upload(
            Bucket=self._store._bucket,
            Key=full_key,
            UploadId=self._upload_id,
            MultipartUpload={"Parts": self._parts},
        )
        self._completed = True

    async def abort(self) -> None:
        if self._finishing is not None:
            await asyncio.gather(self._finishing, return_exceptions=True)
            await self._store.delete([self._key])
        if self._upload_id is not None and not self._completed:
            await self._store._call(
                "abort_multipart_upload",
                self._client.abort_multipart_upload,
                Bucket=self._store._bucket,
                Key=self._store._key(self._key),
                UploadId=self._upload_id,
            )
            log.info("blob.upload_aborted key=%s", self._key)
