"""An in-memory BlobStore for fast unit tests of the store's logic.

It keeps S3's semantics that the logic relies on (ordered listing, conditional
put, uploads invisible until kept at their content address) and nothing else;
the S3 implementation has its own tests against a real S3 HTTP endpoint.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from datetime import datetime

from loraserve.adapterstore.blobs.blobstore import (
    BlobNotFound,
    ReceivedBlob,
    StoredObject,
    blob_key,
)


class MemoryBlobStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.open_uploads: set[str] = set()

    async def check(self) -> None:
        return None

    async def start_upload(self, sha256: str = "") -> _MemoryUpload:
        return _MemoryUpload(self, sha256)

    async def sweep_stale_uploads(self, cutoff: datetime) -> int:
        # Uploads here live in memory: none outlive the process that started them.
        return 0

    async def put(self, key: str, data: bytes) -> None:
        self.objects[key] = bytes(data)

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        if key in self.objects:
            return False
        self.objects[key] = bytes(data)
        return True

    async def get(self, key: str) -> bytes:
        try:
            return self.objects[key]
        except KeyError:
            raise BlobNotFound(key) from None

    async def stream(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        data = await self.get(key)
        for start in range(0, len(data), chunk_size):
            yield data[start : start + chunk_size]

    async def list_keys(self, prefix: str, start_after: str = "", limit: int = 0) -> list[str]:
        keys = sorted(k for k in self.objects if k.startswith(prefix) and k > start_after)
        return keys[:limit] if limit else keys

    async def list_objects(
        self, prefix: str, start_after: str = "", limit: int = 0
    ) -> list[StoredObject]:
        return [
            StoredObject(key, hashlib.md5(self.objects[key]).hexdigest())
            for key in await self.list_keys(prefix, start_after, limit)
        ]

    async def delete(self, keys: list[str]) -> None:
        for key in keys:
            self.objects.pop(key, None)


class _MemoryUpload:
    def __init__(self, store: MemoryBlobStore, declared_sha256: str) -> None:
        self._store = store
        self._declared = declared_sha256
        self._id = uuid.uuid4().hex
        self._data = bytearray()
        self._sha256 = ""
        store.open_uploads.add(self._id)

    async def write(self, data: bytes) -> None:
        self._data += data

    async def finish(self) -> ReceivedBlob:
        self._sha256 = hashlib.sha256(self._data).hexdigest()
        return ReceivedBlob(self._sha256, len(self._data))

    async def keep(self) -> str:
        if not self._sha256 or (self._declared and self._sha256 != self._declared):
            raise RuntimeError(f"upload of sha256 {self._sha256} kept as {self._declared}")
        key = blob_key(self._sha256)
        self._store.objects.setdefault(key, bytes(self._data))
        self._store.open_uploads.discard(self._id)
        return key

    async def abort(self) -> None:
        self._store.open_uploads.discard(self._id)
