"""An in-memory BlobStore for fast unit tests of the store's logic.

It keeps S3's semantics that the logic relies on (ordered listing, conditional
put, content-addressed keep) and nothing else; the S3 implementation has its own
tests against a real S3 HTTP endpoint.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator

from loraserve.adapterstore.blobstore import BlobNotFound, StagedBlob, blob_key


class MemoryBlobStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.open_uploads: set[str] = set()

    async def check(self) -> None:
        return None

    async def start_upload(self) -> _MemoryUpload:
        return _MemoryUpload(self, f"tmp/{uuid.uuid4().hex}")

    async def keep(self, staged: StagedBlob) -> str:
        key = blob_key(staged.sha256)
        self.objects.setdefault(key, self.objects[staged.temp_key])
        del self.objects[staged.temp_key]
        return key

    async def discard(self, staged: StagedBlob) -> None:
        self.objects.pop(staged.temp_key, None)

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

    async def delete(self, keys: list[str]) -> None:
        for key in keys:
            self.objects.pop(key, None)


class _MemoryUpload:
    def __init__(self, store: MemoryBlobStore, key: str) -> None:
        self._store = store
        self._key = key
        self._data = bytearray()
        store.open_uploads.add(key)

    async def write(self, data: bytes) -> None:
        self._data += data

    async def finish(self) -> StagedBlob:
        self._store.open_uploads.discard(self._key)
        self._store.objects[self._key] = bytes(self._data)
        return StagedBlob(self._key, hashlib.sha256(self._data).hexdigest(), len(self._data))

    async def abort(self) -> None:
        self._store.open_uploads.discard(self._key)
