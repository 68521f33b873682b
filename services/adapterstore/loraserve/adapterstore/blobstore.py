"""The seam between the store's logic and object storage.

Keys are relative to the store's own prefix; an implementation adds its bucket
and prefix. Content-addressed blobs live at `blobs/sha256/<hex>`: a file is
first staged under a temporary key while it is hashed, and only `keep` moves
it to its content address, so a rejected push leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

BLOB_PREFIX = "blobs/sha256/"


def blob_key(sha256: str) -> str:
    return f"{BLOB_PREFIX}{sha256}"


class BlobNotFound(Exception):
    """The key does not exist. Internal to the seam: callers turn it into a domain error."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object at key {key!r}")
        self.key = key


@dataclass(frozen=True, slots=True)
class StagedBlob:
    """A file uploaded to a temporary key, hashed, not yet at its content address."""

    temp_key: str
    sha256: str
    size: int


class BlobUpload(Protocol):
    """A streaming upload in bounded memory; exactly one of `finish`/`abort` ends it."""

    async def write(self, data: bytes) -> None: ...

    async def finish(self) -> StagedBlob: ...

    async def abort(self) -> None: ...


class BlobStore(Protocol):
    async def check(self) -> None:
        """Raises if the storage cannot be reached (used for health)."""

    async def start_upload(self) -> BlobUpload:
        """Starts staging a new file under a fresh temporary key."""

    async def keep(self, staged: StagedBlob) -> str:
        """Moves a staged file to its content address (unless a blob is there
        already), deletes the temporary key and returns the blob's key."""

    async def discard(self, staged: StagedBlob) -> None:
        """Deletes a staged file that will not be kept."""

    async def put(self, key: str, data: bytes) -> None:
        """Writes a small object, replacing any object at `key`."""

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        """Writes a small object only if `key` is free; False if it was taken."""

    async def get(self, key: str) -> bytes:
        """Reads a small object whole; raises BlobNotFound."""

    def stream(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        """Reads an object in chunks of at most `chunk_size` bytes; raises BlobNotFound."""

    async def list_keys(self, prefix: str, start_after: str = "", limit: int = 0) -> list[str]:
        """Keys under `prefix` after `start_after`, in order; all of them when limit is 0."""

    async def delete(self, keys: list[str]) -> None:
        """Deletes keys; missing keys are not an error."""
