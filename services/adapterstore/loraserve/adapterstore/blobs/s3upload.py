"""Streaming uploads of S3BlobStore: a file is hashed in order and sent as one multipart
upload with at most `parts_in_flight` parts in flight, so memory per upload is about
(parts_in_flight + 1) x part_size, whatever the file's size.

`DirectUpload` (sha256 declared) targets blobs/sha256/<declared> and completes only
for bytes that hashed to it; `StagedUpload` writes tmp/<uuid> and copies it to its
content address. Either way nothing is visible at a content address unless its bytes
hash to it (docs/design.md, "Uploads"). A declared file smaller than one part is held
in memory until `keep` and sent as one PUT (boto3's transfer manager does the same
below its multipart threshold), while the store's `HeldBytes` budget allows.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from loraserve.adapterstore.blobs.blobstore import ReceivedBlob, blob_key

if TYPE_CHECKING:
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

    from loraserve.adapterstore.blobs.s3blobs import S3BlobStore

log = logging.getLogger(__name__)

T = TypeVar("T")


def _remembered(request: Awaitable[T]) -> asyncio.Future[T]:
    """Runs a storage request as its own task. Callers await it shielded: a
    cancelled caller does not stop boto3's worker thread, so `abort` must be able
    to wait for what the request still writes."""
    return asyncio.ensure_future(request)


async def _settle(futures: list[asyncio.Future[Any]]) -> None:
    """Waits for every future, without cancelling any when this wait is cancelled,
    and marks their errors as seen (the caller already reported the first one)."""
    if futures:
        await asyncio.wait(futures)
    for future in futures:
        if not future.cancelled():
            future.exception()


def _checksum_algorithm(client: Any) -> dict[str, Any]:
    """The checksum boto3's transfer manager gives a multipart upload: CRC32 of every
    part, checked by S3 as each part arrives and again, from the parts' values, when
    the upload completes; none where the client computes checksums only when an
    operation requires them (`request_checksum_calculation`, for backends that refuse
    them). It is also quicker to complete: moto completed 73 MB in nine parts in
    0.19-0.22 s with the parts' checksums, 0.30-0.31 s without."""
    if client.meta.config.request_checksum_calculation == "when_supported":
        return {"ChecksumAlgorithm": "CRC32"}
    return {}


def _succeeded(future: asyncio.Future[Any] | None) -> bool:
    return (
        future is not None
        and future.done()
        and not future.cancelled()
        and future.exception() is None
    )


class _Parts:
    """Cuts a stream into parts, hashes them in order and sends them as one
    multipart upload to `key`; with `send` False it only hashes. Neither hashing
    nor sending holds up `write`, until `parts_in_flight` parts are in hand."""

    def __init__(self, store: S3BlobStore, key: str, send: bool) -> None:
        self._store = store
        self._key = store.full_key(key)
        self._send = send
        self._pending: list[bytes] = []
        self._pending_size = 0
        self.size = 0
        self._hash = hashlib.sha256()
        self._hashing: asyncio.Future[None] | None = None
        self._slots = asyncio.Semaphore(store.parts_in_flight)
        self._creating: asyncio.Future[str] | None = None
        self._parts: list[asyncio.Future[CompletedPartTypeDef]] = []
        self._completing: asyncio.Future[Any] | None = None
        self._checksum = _checksum_algorithm(store.client)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    @property
    def multipart(self) -> bool:
        return self._creating is not None

    async def write(self, data: bytes) -> None:
        self._pending.append(data)
        self._pending_size += len(data)
        self.size += len(data)
        if self._pending_size >= self._store.part_size:
            await self._cut(self._take())

    async def finish(self, one_request_below: int) -> bytes | None:
        """Hashes and sends what is left, then waits for every part. A file of
        fewer than `one_request_below` bytes is not sent: its bytes are returned
        for the caller to write in one request."""
        rest = self._take()
        if not self.multipart and self.size < one_request_below:
            if self._hashing is not None:
                await asyncio.shield(self._hashing)
            await asyncio.to_thread(self._hash.update, rest)
            return rest
        if rest:
            await self._cut(rest)
        for part in self._parts:
            await asyncio.shield(part)
        return None

    async def complete(self) -> None:
        """Makes the finished multipart upload the object at `key`."""
        upload_id = await self._upload_id()
        parts = [part.result() for part in self._parts]
        self._completing = _remembered(
            self._store.call(
                "complete_multipart_upload",
                self._store.client.complete_multipart_upload,
                Bucket=self._store.bucket,
                Key=self._key,
                UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )
        )
        await asyncio.shield(self._completing)

    async def abort(self) -> bool:
        """Waits for the requests already made, then aborts the multipart upload
        unless it was completed. True when the object at `key` was written."""
        started = [f for f in (self._creating, *self._parts, self._completing) if f]
        await _settle(started)
        if _succeeded(self._completing):
            return True
        if self._creating is not None and _succeeded(self._creating):
            await self._store.call(
                "abort_multipart_upload",
                self._store.client.abort_multipart_upload,
                Bucket=self._store.bucket,
                Key=self._key,
                UploadId=self._creating.result(),
            )
            log.info("blob.upload_aborted key=%s", self._key)
        return False

    def _take(self) -> bytes:
        data = b"".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        return data

    async def _cut(self, part: bytes) -> None:
        """Starts hashing and sending `part` once a slot is free."""
        await self._slots.acquire()
        try:
            self._raise_failed_part()
            upload_id = await self._upload_id() if self._send else None
        except BaseException:
            self._slots.release()
            raise
        # sha256 needs the bytes in order, so each part's hashing waits for the previous.
        self._hashing = asyncio.ensure_future(self._hash_after(self._hashing, part))
        number = len(self._parts) + 1
        self._parts.append(
            asyncio.ensure_future(self._handle(upload_id, number, part, self._hashing))
        )

    async def _hash_after(self, previous: asyncio.Future[None] | None, part: bytes) -> None:
        if previous is not None:
            await previous
        # hashlib releases the GIL on big updates: receiving goes on meanwhile.
        await asyncio.to_thread(self._hash.update, part)

    async def _handle(
        self, upload_id: str | None, number: int, part: bytes, hashing: asyncio.Future[None]
    ) -> CompletedPartTypeDef:
        """Sends a part and waits until it is hashed; its slot bounds memory until then."""
        completed: CompletedPartTypeDef = {"ETag": "", "PartNumber": number}
        try:
            if upload_id is not None:
                response = await self._store.call(
                    "upload_part",
                    self._store.client.upload_part,
                    Bucket=self._store.bucket,
                    Key=self._key,
                    UploadId=upload_id,
                    PartNumber=number,
                    Body=part,
                    **self._checksum,
                )
                completed["ETag"] = response["ETag"]
                if self._checksum and "ChecksumCRC32" in response:
                    completed["ChecksumCRC32"] = response["ChecksumCRC32"]
            await hashing
        finally:
            self._slots.release()
        return completed

    def _raise_failed_part(self) -> None:
        for part in self._parts:
            if part.done() and not part.cancelled() and (error := part.exception()):
                raise error

    async def _upload_id(self) -> str:
        if self._creating is None:
            self._creating = _remembered(
                self._store.call("create_multipart_upload", self._create_multipart)
            )
        return await asyncio.shield(self._creating)

    def _create_multipart(self) -> str:
        created = self._store.client.create_multipart_upload(
            Bucket=self._store.bucket, Key=self._key, **self._checksum
        )
        return created["UploadId"]


class HeldBytes:
    """How many bytes of small files a store may hold between a push's end of file
    and its commit. A multipart upload costs three requests (create, part, complete)
    where a held file costs one PUT at `keep`; the budget keeps memory bounded
    however many files and pushes are in flight (past it, files go multipart)."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def take(self, size: int) -> bool:
        if size > self.left:
            return False
        self.left -= size
        return True

    def give_back(self, size: int) -> None:
        self.left += size


class DirectUpload:
    """A file with a declared sha256, uploaded straight to its content address."""

    def __init__(self, store: S3BlobStore, sha256: str, exists: bool) -> None:
        self._store = store
        self._declared = sha256
        self._key = blob_key(sha256)
        self._exists = exists
        self._parts = _Parts(store, self._key, send=not exists)
        self._finished = False
        # A file under one part, kept in memory until `keep` sends it in one PUT.
        self._held: bytes | None = None
        self._putting: asyncio.Future[None] | None = None

    async def write(self, data: bytes) -> None:
        await self._parts.write(data)

    async def finish(self) -> ReceivedBlob:
        size = self._parts.size
        hold = (
            not self._exists
            and not self._parts.multipart
            and size < self._store.part_size
            and self._store.held.take(size)
        )
        try:
            rest = await self._parts.finish(one_request_below=size + 1 if hold else 1)
        except BaseException:
            if hold:
                self._store.held.give_back(size)
            raise
        if hold:
            self._held = rest
        self._finished = True
        return ReceivedBlob(self._parts.sha256, self._parts.size)

    async def keep(self) -> str:
        if not self._finished or self._parts.sha256 != self._declared:
            raise RuntimeError(
                f"refusing to keep an upload at {self._key}: it is unfinished or its "
                f"bytes have sha256 {self._parts.sha256}"
            )
        if self._exists:
            return self._key
        if self._held is not None:
            self._putting = _remembered(self._store.put(self._key, self._held))
            try:
                await asyncio.shield(self._putting)
            finally:
                self._release()
        else:
            # Not held (so at least a byte, as an empty file always fits): multipart.
            await self._parts.complete()
        return self._key

    async def abort(self) -> None:
        # Never deletes the key: an object there holds the declared bytes (only
        # a matching hash completes an upload or is put), and committed revisions may
        # share it.
        if self._putting is not None:
            await _settle([self._putting])
        self._release()
        await self._parts.abort()

    def _release(self) -> None:
        if self._held is not None:
            self._store.held.give_back(len(self._held))
            self._held = None


class StagedUpload:
    """A file without a declared sha256, staged under tmp/ until its hash is known."""

    def __init__(self, store: S3BlobStore) -> None:
        self._store = store
        self._temp_key = f"tmp/{uuid.uuid4().hex}"
        self._parts = _Parts(store, self._temp_key, send=True)
        self._putting: asyncio.Future[None] | None = None
        self._finished = False

    async def write(self, data: bytes) -> None:
        await self._parts.write(data)

    async def finish(self) -> ReceivedBlob:
        rest = await self._parts.finish(one_request_below=self._store.part_size)
        if rest is None:
            await self._parts.complete()
        else:
            self._putting = _remembered(self._store.put(self._temp_key, rest))
            await asyncio.shield(self._putting)
        self._finished = True
        return ReceivedBlob(self._parts.sha256, self._parts.size)

    async def keep(self) -> str:
        if not self._finished:
            raise RuntimeError(f"refusing to keep the unfinished upload at {self._temp_key}")
        key = blob_key(self._parts.sha256)
        if not await self._store.exists(key):
            await self._store.copy(self._temp_key, key)
        await self._store.delete([self._temp_key])
        return key

    async def abort(self) -> None:
        putting = [self._putting] if self._putting is not None else []
        await _settle(putting)
        if await self._parts.abort() or putting:
            await self._store.delete([self._temp_key])
