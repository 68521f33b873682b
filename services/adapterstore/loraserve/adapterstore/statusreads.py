"""Reading replica statuses a page at a time, at a cost of O(replicas) requests.

`GetAdapterStatus` lists the status keys (one LIST request per 1,000 statuses,
with each object's ETag) and the replicas' signs of life, then reads only what
the page needs and this store replica has not read in that version: each object
is kept in memory under its ETag, so a status is read from storage once per
change, not once per call. A page holds at most `page_size` statuses and is cut
before its encoding passes MAX_PAGE_BYTES. Expired statuses found on the way are
deleted, as before (see status.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from loraserve.adapterstore import pagetokens
from loraserve.adapterstore.blobstore import BlobNotFound, BlobStore, StoredObject
from loraserve.adapterstore.model import now
from loraserve.adapterstore.status import (
    REPLICA_PREFIX,
    STATUS_PREFIX,
    ReplicaStatus,
    ReportType,
    read_status,
    replica_key,
)
from loraserve.common.errors import InvalidArgument
from loraserve.common.names import validate_adapter_name
from loraserve.common.textlimits import PageFill

log = logging.getLogger(__name__)

_READ_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class StatusPage:
    statuses: list[ReplicaStatus]
    next_page_token: str


class StatusReader:
    """Pages of statuses, each object read once per version (its ETag)."""

    def __init__(self, blobs: BlobStore, ttl: timedelta) -> None:
        self._blobs = blobs
        self._ttl = ttl
        # Store key -> (ETag, what the object held): statuses and signs of life.
        self._statuses: dict[str, tuple[str, ReplicaStatus | None]] = {}
        self._seen: dict[str, tuple[str, datetime | None]] = {}

    def forget(self, key: str) -> None:
        """Drops a cached object this replica has just rewritten or deleted."""
        self._statuses.pop(key, None)
        self._seen.pop(key, None)

    async def page(
        self,
        adapter_name: str,
        page_size: int,
        page_token: str,
        max_page_bytes: int,
        size_of: Callable[[ReplicaStatus], int],
    ) -> StatusPage:
        """Statuses in key order (by adapter, then replica), after the key
        `page_token` names. Keys are listed from there, a page's worth at a time."""
        size = pagetokens.page_size(page_size)
        prefix = STATUS_PREFIX + (validate_adapter_name(adapter_name) + "/" if adapter_name else "")
        after = _decode_token(page_token, adapter_name)
        live, dead = await self._replicas()
        oldest = now() - self._ttl
        fill = PageFill(size, max_page_bytes)
        shown: list[tuple[str, ReplicaStatus]] = []
        expired: list[str] = []
        cut = more = False
        while not cut:
            # What is still missing from the page, and one key more to tell whether
            # anything follows: a page costs its own statuses and the expired ones
            # among them, however many statuses the store holds.
            wanted = size - len(shown)
            listed = await self._blobs.list_objects(prefix, after, limit=wanted + 1)
            batch = listed[:wanted]
            for stored, status in zip(batch, await self._read_all(batch), strict=True):
                if status is not None and not _shown(status, oldest, live):
                    expired.append(stored.key)
                elif status is not None and not fill.room_for(size_of(status)):
                    cut = True  # the rest comes on the next page, this one first
                    break
                elif status is not None:
                    shown.append((stored.key, status))
                after = stored.key
            more = cut or len(listed) > wanted
            if not more or len(shown) == size:
                break
        await self._expire(expired + dead)
        next_token = _encode_token(adapter_name, shown[-1][0]) if more and shown else ""
        return StatusPage([status for _, status in shown], next_token)

    async def _read_all(self, batch: list[StoredObject]) -> list[ReplicaStatus | None]:
        limit = asyncio.Semaphore(_READ_CONCURRENCY)

        async def read(stored: StoredObject) -> ReplicaStatus | None:
            async with limit:
                return await self._status(stored)

        return list(await asyncio.gather(*(read(o) for o in batch)))

    async def _status(self, stored: StoredObject) -> ReplicaStatus | None:
        cached = self._statuses.get(stored.key)
        if cached is not None and cached[0] == stored.etag:
            return cached[1]
        status = await read_status(self._blobs, stored.key)
        if status is not None:
            self._statuses[stored.key] = (stored.etag, status)
        return status

    async def _replicas(self) -> tuple[set[str], list[str]]:
        """Keys of the replicas whose sign of life is younger than the TTL, and of
        those whose sign of life is older. One LIST, and a read per sign of life
        changed since this replica last read it: O(replicas)."""
        objects = await self._blobs.list_objects(REPLICA_PREFIX)
        limit = asyncio.Semaphore(_READ_CONCURRENCY)

        async def seen(stored: StoredObject) -> datetime | None:
            async with limit:
                return await self.seen_time(stored.key, stored.etag)

        times = await asyncio.gather(*map(seen, objects))
        oldest = now() - self._ttl
        live = {o.key for o, t in zip(objects, times, strict=True) if t is not None and t >= oldest}
        return live, [o.key for o in objects if o.key not in live]

    async def seen_time(self, key: str, etag: str = "") -> datetime | None:
        """When the replica at `key` last showed a sign of life; None if never (or
        unreadable: only bookkeeping, treated as expired rather than failing reads)."""
        cached = self._seen.get(key)
        if etag and cached is not None and cached[0] == etag:
            return cached[1]
        try:
            data = json.loads(await self._blobs.get(key))
            seen: datetime | None = datetime.fromisoformat(str(data["seen_time"]))
        except BlobNotFound:
            return None
        except (ValueError, KeyError, TypeError):
            log.warning("status.corrupt_sign_of_life key=%s", key)
            seen = None
        if etag:
            self._seen[key] = (etag, seen)
        return seen

    async def _expire(self, keys: list[str]) -> None:
        if keys:
            log.info("status.expired objects=%d", len(keys))
            await self._blobs.delete(keys)
            for key in keys:
                self.forget(key)


def _shown(status: ReplicaStatus, oldest: datetime, live: set[str]) -> bool:
    """A status is shown while it, or (unless it is REMOVED) its replica's sign of
    life, is younger than the TTL."""
    return status.update_time >= oldest or (
        status.type is not ReportType.REMOVED and replica_key(status.replica_id) in live
    )


def _encode_token(adapter_name: str, last_key: str) -> str:
    return pagetokens.encode_token(f"{adapter_name}:{last_key}")


def _decode_token(token: str, adapter_name: str) -> str:
    """The key of the status the previous page ended with; "" for the first page."""
    value = pagetokens.decode_token(token, "GetAdapterStatus")
    if not value:
        return ""
    name, sep, key = value.partition(":")
    within = STATUS_PREFIX + (f"{adapter_name}/" if adapter_name else "")
    if not sep or not key.startswith(STATUS_PREFIX) or not key.endswith(".json"):
        raise InvalidArgument("invalid page_token for GetAdapterStatus")
    if name != adapter_name or not key.startswith(within):
        raise InvalidArgument(
            "page_token for GetAdapterStatus was made for another name; ask from the first page"
        )
    return key
