"""BlobStore on any S3-compatible endpoint (AWS, MinIO, the moto emulator) with boto3.

boto3 blocks, so every call runs in a worker thread of the store's own pool, one
thread per pooled connection: asyncio's default pool (cores + 4 threads, 6 on two
cores) would cap the parts in flight below `parts_in_flight` and queue them behind
the push's hashing and value checks. Uploads (see s3upload) are multipart with parts
of `part_size` bytes, `parts_in_flight` of them sent at once; a declared file smaller
than one part is one PUT at commit, within `held_bytes` held at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
import botocore.config
from botocore.exceptions import BotoCoreError, ClientError

from loraserve.adapterstore.blobs.blobstore import BlobNotFound, BlobUpload, StoredObject, blob_key
from loraserve.adapterstore.blobs.s3sweep import sweep_stale_uploads
from loraserve.adapterstore.blobs.s3trace import count_bytes, s3_span
from loraserve.adapterstore.blobs.s3upload import DirectUpload, HeldBytes, StagedUpload
from loraserve.common.errors import FailedPrecondition, Unavailable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

log = logging.getLogger(__name__)

T = TypeVar("T")

# S3 refuses parts under 5 MiB (except the last one).
MIN_PART_SIZE = 5 * 1024 * 1024
DEFAULT_PART_SIZE = 8 * 1024 * 1024
# Enough parts on the wire to hide one part's round trip behind the others; more
# (boto3's transfer manager sends 10) measured slower on a 2-core emulator (benchmark
# 21, docs/design.md "Writes at the speed of S3").
DEFAULT_PARTS_IN_FLIGHT = 4
# boto3's connections to S3, and the threads that use them.
CONNECTIONS = 32
# Bytes of small declared files held for one PUT each at commit (s3upload.HeldBytes).
DEFAULT_HELD_BYTES = 64 * 1024 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
# 409 ConditionalRequestConflict: AWS's answer when a concurrent conditional write
# to the same key is in flight; either way the key is not ours.
_TAKEN_CODES = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
# Backends without conditional writes may say so instead of ignoring the header.
_UNSUPPORTED_CODES = frozenset({"NotImplemented", "501"})


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


@functools.cache
def _session() -> boto3.session.Session:
    """One boto3 session per process: each new one parses botocore's service models
    again (about a quarter of a CPU-second), and the store makes several clients."""
    return boto3.session.Session()


# boto3 sessions are not thread-safe; the clients they make are.
_session_lock = threading.Lock()


def make_client(location: S3Location, signature_version: str | None = None) -> S3Client:
    config = botocore.config.Config(
        retries={"max_attempts": 5, "mode": "standard"},
        signature_version=signature_version,
        max_pool_connections=CONNECTIONS,
        # Path-style addressing: MinIO and emulators do not serve virtual-host buckets.
        s3={"addressing_style": "path"} if location.endpoint_url else {},
    )
    with _session_lock:
        return _session().client(
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
    def __init__(
        self,
        location: S3Location,
        part_size: int = DEFAULT_PART_SIZE,
        parts_in_flight: int = DEFAULT_PARTS_IN_FLIGHT,
        held_bytes: int = DEFAULT_HELD_BYTES,
    ) -> None:
        if part_size < MIN_PART_SIZE:
            raise ValueError(f"part_size must be at least {MIN_PART_SIZE} bytes")
        if parts_in_flight < 1:
            raise ValueError("parts_in_flight must be at least 1")
        self._location = location
        self.bucket = location.bucket
        prefix = location.prefix.strip("/")
        self._prefix = f"{prefix}/" if prefix else ""
        self.part_size = part_size
        self.parts_in_flight = parts_in_flight
        self.held = HeldBytes(held_bytes)
        self.client = make_client(location)
        self._threads = ThreadPoolExecutor(CONNECTIONS, thread_name_prefix="s3")

    def full_key(self, key: str) -> str:
        """The bucket key of a store key."""
        return self._prefix + key

    async def call(self, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Runs a boto3 call in a worker thread, with its errors as the seam's, in a
        span of its kind (s3trace)."""
        with s3_span(what, self.bucket, kwargs) as span:
            result = await self._call(what, fn, *args, **kwargs)
            count_bytes(span, result)
            return result

    async def _call(self, what: str, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        try:
            return await self.run(fn, *args, **kwargs)
        except ClientError as e:
            code = _error_code(e)
            if code in _NOT_FOUND_CODES:
                raise BlobNotFound(str(kwargs.get("Key", what))) from e
            raise Unavailable(f"object storage: {what} failed: {code or e}") from e
        except BotoCoreError as e:
            raise Unavailable(f"object storage: {what} failed: {e}") from e

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Runs a blocking call in the store's S3 threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(fn, *args, **kwargs))

    async def check(self) -> None:
        try:
            await self.call("head_bucket", self.client.head_bucket, Bucket=self.bucket)
        except BlobNotFound:
            raise Unavailable(f"object storage: bucket {self.bucket!r} does not exist") from None

    async def start_upload(self, sha256: str = "") -> BlobUpload:
        if not sha256:
            return StagedUpload(self)
        if not _SHA256.fullmatch(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return DirectUpload(self, sha256, exists=await self.exists(blob_key(sha256)))

    async def sweep_stale_uploads(self, cutoff: datetime) -> int:
        return await sweep_stale_uploads(self, cutoff)

    async def exists(self, key: str) -> bool:
        try:
            await self.call(
                "head_object", self.client.head_object, Bucket=self.bucket, Key=self.full_key(key)
            )
        except BlobNotFound:
            return False
        return True

    async def copy(self, source: str, target: str) -> None:
        # `copy` is the managed transfer: it switches to multipart copy for large
        # objects, which a single CopyObject (5 GiB at most) cannot do.
        await self.call(
            "copy",
            self.client.copy,
            {"Bucket": self.bucket, "Key": self.full_key(source)},
            self.bucket,
            self.full_key(target),
        )

    async def put(self, key: str, data: bytes) -> None:
        await self.call(
            "put_object",
            self.client.put_object,
            Bucket=self.bucket,
            Key=self.full_key(key),
            Body=data,
        )

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        request = {"Bucket": self.bucket, "Key": self.full_key(key), "Body": data}
        with s3_span("put_if_absent", self.bucket, request) as span:
            taken = not await self._put_if_absent(request)
            span.set_attribute("loraserve.s3.taken", taken)
            return not taken

    async def _put_if_absent(self, request: dict[str, Any]) -> bool:
        try:
            await self.run(self.client.put_object, **request, IfNoneMatch="*")
        except ClientError as e:
            if _error_code(e) in _TAKEN_CODES:
                return False
            if _error_code(e) in _UNSUPPORTED_CODES:
                raise FailedPrecondition(
                    "object storage does not support conditional writes "
                    f"(If-None-Match: * on PUT answered {_error_code(e)}); the store needs them"
                ) from e
            raise Unavailable(
                f"object storage: conditional put failed: {_error_code(e) or e}"
            ) from e
        except BotoCoreError as e:
            raise Unavailable(f"object storage: conditional put failed: {e}") from e
        return True

    async def get(self, key: str) -> bytes:
        response = await self.call(
            "get_object", self.client.get_object, Bucket=self.bucket, Key=self.full_key(key)
        )
        body = response["Body"]
        try:
            return await self.call("read", body.read)
        finally:
            body.close()

    async def stream(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        response = await self.call(
            "get_object", self.client.get_object, Bucket=self.bucket, Key=self.full_key(key)
        )
        body = response["Body"]
        try:
            # Untraced: a span per chunk would outnumber everything else in a trace.
            while chunk := await self._call("read", body.read, chunk_size):
                yield chunk
        finally:
            body.close()

    async def list_keys(self, prefix: str, start_after: str = "", limit: int = 0) -> list[str]:
        return await self.call("list_objects_v2", self._list_keys, prefix, start_after, limit)

    def _list_keys(self, prefix: str, start_after: str, limit: int) -> list[str]:
        keys: list[str] = []
        for page in self._pages(prefix, start_after, limit):
            for item in page.get("Contents", []):
                keys.append(item["Key"][len(self._prefix) :])
                if limit and len(keys) >= limit:
                    return keys
        return keys

    async def list_objects(
        self, prefix: str, start_after: str = "", limit: int = 0
    ) -> list[StoredObject]:
        return await self.call("list_objects_v2", self._list_objects, prefix, start_after, limit)

    def _list_objects(self, prefix: str, start_after: str, limit: int) -> list[StoredObject]:
        found: list[StoredObject] = []
        for page in self._pages(prefix, start_after, limit):
            for item in page.get("Contents", []):
                found.append(StoredObject(item["Key"][len(self._prefix) :], item["ETag"]))
                if limit and len(found) >= limit:
                    return found
        return found

    def _pages(self, prefix: str, start_after: str, limit: int) -> Iterator[Any]:
        """Pages of a listing under `prefix` after `start_after`, of at most `limit`
        keys each (when set): a look for a few keys reads a few keys. Blocking."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.full_key(prefix)}
        if start_after:
            kwargs["StartAfter"] = self.full_key(start_after)
        if limit:
            kwargs["PaginationConfig"] = {"PageSize": min(limit, 1000)}
        return iter(self.client.get_paginator("list_objects_v2").paginate(**kwargs))

    async def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self.full_key(k)} for k in keys[start : start + 1000]]
            response = await self.call(
                "delete_objects",
                self.client.delete_objects,
                Bucket=self.bucket,
                Delete={"Objects": batch, "Quiet": True},
            )
            if errors := response.get("Errors"):
                raise Unavailable(f"object storage: delete failed for {len(errors)} key(s)")
