"""The seam between the store's logic and object storage.

Keys are relative to the store's own prefix; an implementation adds its bucket
and prefix. Content-addressed blobs live at `blobs/sha256/<hex>`. A pushed file
streams into a `BlobUpload` that keeps its bytes invisible there until `keep`,
so a rejected push leaves nothing behind and a blob never holds wrong content.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
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
class StoredObject:
    """A key as a listing names it, with its version tag: an ETag changes whenever
    the object is written again, so a reader can keep what it read under it."""

    key: str
    etag: str


@dataclass(frozen=True, slots=True)
class ReceivedBlob:
    """What `BlobUpload.finish` measured of the bytes written."""

    sha256: str
    size: int


class BlobUpload(Protocol):
    """A file streamed to storage in bounded memory, invisible until kept.

    `write` the bytes, `finish` to hash them all, then `keep` to make them readable
    at their content address. `abort` ends an upload that will not be kept, at any
    point before `keep` returns, and removes what it wrote."""

    async def write(self, data: bytes) -> None: ...

    async def finish(self) -> ReceivedBlob: ...

    async def keep(self) -> str:
        """Makes the finished bytes readable at `blob_key(sha256)`; returns that key."""

    async def abort(self) -> None: ...


class BlobStore(Protocol):
    async def check(self) -> None:
        """Raises if the storage cannot be reached (used for health)."""

    async def start_upload(self, sha256: str = "") -> BlobUpload:
        """Starts receiving a file. `sha256`, when the sender declared it, lets the
        bytes go straight towards their content address (and skips sending bytes a
        blob there already holds); `keep` then refuses any other content."""

    async def sweep_stale_uploads(self, cutoff: datetime) -> int:
        """Deletes what uploads started before `cutoff` left unfinished (a process
        killed mid-push); returns how many it deleted."""

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

    async def list_objects(
        self, prefix: str, start_after: str = "", limit: int = 0
    ) -> list[StoredObject]:
        """Keys under `prefix` after `start_after`, in order, each with its ETag; all
        of them when limit is 0."""

    async def delete(self, keys: list[str]) -> None:
        """Deletes keys; missing keys are not an error."""
