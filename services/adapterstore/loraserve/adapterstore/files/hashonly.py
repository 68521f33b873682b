"""Receiving a push without storing it: the files are hashed, never uploaded.

A retry of a push the log already holds (its idempotency key is there) needs only
the files' digests, to tell a retry from the key reused for other content. When
the header declares every sha256 the store answers from the header alone; when it
does not, the files are received through these uploads, which hash and keep
nothing, so a retried push writes no byte to storage either way.
"""

from __future__ import annotations

import asyncio
import hashlib

from loraserve.adapterstore.blobs import ReceivedBlob

# Chunks at least this large are hashed in a worker thread (hashlib releases the
# GIL), so receiving the next one overlaps.
_THREAD_HASH_BYTES = 64 * 1024


class HashOnlyUploads:
    """The `start_upload` of a BlobStore whose uploads only hash."""

    async def start_upload(self, sha256: str = "") -> HashOnlyUpload:
        return HashOnlyUpload()


class HashOnlyUpload:
    """A BlobUpload that measures the bytes written and stores none of them."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._size = 0

    async def write(self, data: bytes) -> None:
        self._size += len(data)
        if len(data) >= _THREAD_HASH_BYTES:
            await asyncio.to_thread(self._hash.update, data)
        else:
            self._hash.update(data)

    async def finish(self) -> ReceivedBlob:
        return ReceivedBlob(self._hash.hexdigest(), self._size)

    async def keep(self) -> str:
        raise RuntimeError("a hash-only upload is never kept: its bytes were not stored")

    async def abort(self) -> None:
        return None
