"""Reading what replicas reported, at a cost of O(replicas) requests.

A read lists the signs of life (one LIST per 1,000 replicas, with their ETags) and
the status shards it needs (`fleet/<shard>/`, one LIST per 1,000 replicas for one
adapter's shard), then reads only the objects this store replica has not read in
that version: each is kept in memory under its ETag, so it is read from storage once
per change, not once per call. Replicas whose sign of life is older than the TTL
are expired on the way: their sign of life, shards and counters are deleted.

`GetAdapterStatus` pages go by adapter (in name order, the store's adapters only),
then by live replica (in id order): every live replica is listed for every adapter,
with what it reported of it or nothing. A page holds at most `page_size` statuses and
is cut before its encoding passes MAX_PAGE_BYTES.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from loraserve.adapterstore.blobs import BlobNotFound, BlobStore, StoredObject
from loraserve.adapterstore.catalog import now, pagetokens
from loraserve.adapterstore.compat.formats import OLDEST_FORMAT, UnsupportedFormat, check_readable
from loraserve.adapterstore.replicas.model import (
    COUNTERS_PREFIX,
    REPLICA_PREFIX,
    SHARD_PREFIX,
    STALE_AFTER_INTERVALS,
    Liveness,
    ReplicaCounters,
    ReplicaStatus,
    SignOfLife,
    counters_key,
    replica_key,
    replica_of,
    shard_key,
)
from loraserve.common.config.textlimits import PageFill
from loraserve.common.errors import InvalidArgument
from loraserve.common.fleet.reports import AdapterReport, RevisionCounters
from loraserve.common.statusshards import STATUS_SHARDS, shard_of

log = logging.getLogger(__name__)

_READ_CONCURRENCY = 16
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LiveReplica:
    seen: SignOfLife
    liveness: Liveness


@dataclass(frozen=True, slots=True)
class ShardContent:
    update_time: datetime
    adapters: dict[str, AdapterReport]


class StatusReader:
    """Replicas' reports, each object read once per version (its ETag)."""

    def __init__(self, blobs: BlobStore, ttl: timedelta) -> None:
        self._blobs = blobs
        self._ttl = ttl
        # Store key -> (ETag, what the object held; None when unreadable).
        self._seen: dict[str, tuple[str, SignOfLife | None]] = {}
        self._shards: dict[str, tuple[str, ShardContent | None]] = {}
        self._counters: dict[str, tuple[str, ReplicaCounters | None]] = {}

    def forget(self, key: str) -> None:
        """Drops a cached object this replica has just rewritten or deleted."""
        for cache in (self._seen, self._shards, self._counters):
            cache.pop(key, None)

    async def replicas(self) -> dict[str, LiveReplica]:
        """Every replica whose sign of life is younger than the TTL, by id; those older
        are expired (their objects deleted)."""
        objects = await self._blobs.list_objects(REPLICA_PREFIX)
        seen = await _gather(lambda o: self._cached(self._seen, o, _sign_of_life), objects)
        time = now()
        live: dict[str, LiveReplica] = {}
        dead: list[str] = []
        for stored, sign in zip(objects, seen, strict=True):
            if sign is None or time - sign.seen_time > self._ttl:
                dead.append(replica_of(stored.key))
                continue
            stale = sign.interval_s and (
                (time - sign.seen_time).total_seconds() > STALE_AFTER_INTERVALS * sign.interval_s
            )
            live[sign.replica_id] = LiveReplica(sign, Liveness.STALE if stale else Liveness.LIVE)
        await self._expire(dead)
        return dict(sorted(live.items()))

    async def shards(
        self, indexes: Iterable[int], replicas: Iterable[str]
    ) -> dict[tuple[int, str], ShardContent]:
        """(shard, replica) -> ShardContent for the given shards of the given replicas
        that have one; one LIST per shard (all of them at once when most are asked)."""
        wanted = set(indexes)
        ids = set(replicas)
        prefixes = (
            [SHARD_PREFIX] if len(wanted) > 2 else [f"{SHARD_PREFIX}{i:02d}/" for i in wanted]
        )
        listed: list[StoredObject] = []
        for prefix in prefixes:
            listed.extend(await self._blobs.list_objects(prefix))
        objects = [o for o in listed if _shard_index(o.key) in wanted and replica_of(o.key) in ids]
        contents = await _gather(lambda o: self._cached(self._shards, o, _shard), objects)
        return {
            (_shard_index(o.key), replica_of(o.key)): c
            for o, c in zip(objects, contents, strict=True)
            if c is not None
        }

    async def adapter(self, name: str) -> list[ReplicaStatus]:
        """Every live replica's status of one adapter, in replica order."""
        replicas = await self.replicas()
        shards = await self.shards([shard_of(name)], replicas)
        return [
            _status(name, r, shards.get((shard_of(name), r.seen.replica_id)))
            for r in replicas.values()
        ]

    async def page(
        self,
        names: Iterable[str],
        page_size: int,
        token: tuple[str, str],
        max_page_bytes: int,
        size_of: Callable[[ReplicaStatus], int],
    ) -> tuple[list[ReplicaStatus], tuple[str, str] | None]:
        """Statuses of `names` (in order, starting with the token's adapter) by live
        replica, after the (adapter, replica) `token`; and the position of the last
        one shown when more follow."""
        after_name, after_replica = token
        replicas = await self.replicas()
        size = pagetokens.page_size(page_size)
        if not replicas:
            return [], None
        slots: list[tuple[str, LiveReplica]] = []
        for name in names:
            for replica_id, replica in replicas.items():
                if name == after_name and replica_id <= after_replica:
                    continue
                slots.append((name, replica))
            if len(slots) > size:
                break
        # Only the shards this page shows: a cold first page of one adapter on a large
        # fleet would otherwise read every replica's shard at once.
        shown_slots = slots[:size]
        shards = await self.shards(
            {shard_of(n) for n, _ in shown_slots}, {r.seen.replica_id for _, r in shown_slots}
        )
        fill = PageFill(size, max_page_bytes)
        shown: list[ReplicaStatus] = []
        for name, replica in slots:
            status = _status(name, replica, shards.get((shard_of(name), replica.seen.replica_id)))
            if not fill.room_for(size_of(status)):
                last = shown[-1]
                return shown, (last.adapter_name, last.replica_id)
            shown.append(status)
        return shown, None

    async def counters(self) -> list[ReplicaCounters]:
        """The rollout counters of every live replica that reported some."""
        replicas = await self.replicas()
        objects = [
            o
            for o in await self._blobs.list_objects(COUNTERS_PREFIX)
            if replica_of(o.key) in replicas
        ]
        read = await _gather(lambda o: self._cached(self._counters, o, _counters), objects)
        return [c for c in read if c is not None]

    async def seen(self, replica_id: str) -> SignOfLife | None:
        """A replica's sign of life, read now (for a report's `known`)."""
        try:
            return _sign_of_life(await self._blobs.get(replica_key(replica_id)))
        except BlobNotFound:
            return None

    async def _cached(
        self,
        cache: dict[str, tuple[str, T | None]],
        stored: StoredObject,
        parse: Callable[[bytes], T | None],
    ) -> T | None:
        hit = cache.get(stored.key)
        if hit is not None and hit[0] == stored.etag:
            return hit[1]
        try:
            value = parse(await self._blobs.get(stored.key))
        except BlobNotFound:
            return None
        cache[stored.key] = (stored.etag, value)
        return value

    async def _expire(self, replicas: list[str]) -> None:
        if not replicas:
            return
        keys = [
            key
            for replica in replicas
            for key in (
                replica_key(replica),
                counters_key(replica),
                *(shard_key(i, replica) for i in range(STATUS_SHARDS)),
            )
        ]
        log.info("status.expired replicas=%d", len(replicas))
        await self._blobs.delete(keys)
        for key in keys:
            self.forget(key)


def _status(name: str, replica: LiveReplica, shard: ShardContent | None) -> ReplicaStatus:
    report = shard.adapters.get(name) if shard is not None else None
    return ReplicaStatus(
        replica_id=replica.seen.replica_id,
        adapter_name=name,
        liveness=replica.liveness,
        seen=replica.seen,
        report=report,
        update_time=shard.update_time if shard is not None and report is not None else None,
    )


async def _gather(read: Callable[[StoredObject], Any], objects: list[StoredObject]) -> list[Any]:
    limit = asyncio.Semaphore(_READ_CONCURRENCY)

    async def one(stored: StoredObject) -> Any:
        async with limit:
            return await read(stored)

    return list(await asyncio.gather(*map(one, objects)))


def _shard_index(key: str) -> int:
    part = key.removeprefix(SHARD_PREFIX).split("/", 1)[0]
    return int(part) if part.isdigit() else -1


def _parse(data: bytes, what: str) -> dict[str, Any] | None:
    """Bookkeeping only: an unreadable object is logged and treated as absent rather
    than failing reads (its replica writes it again), one of a newer format too."""
    try:
        value = json.loads(data)
        if not isinstance(value, dict):
            return None
        check_readable(value, what, unstated=OLDEST_FORMAT)
        return value
    except ValueError:
        log.warning("status.corrupt_object what=%s", what)
        return None
    except UnsupportedFormat as e:
        log.warning("status.unreadable_object what=%s error=%s", what, e.message)
        return None


def _sign_of_life(data: bytes) -> SignOfLife | None:
    value = _parse(data, "sign of life")
    try:
        return SignOfLife.from_json(value) if value is not None else None
    except (ValueError, KeyError, TypeError):
        log.warning("status.corrupt_object what=sign of life")
        return None


def _shard(data: bytes) -> ShardContent | None:
    value = _parse(data, "shard")
    try:
        if value is None:
            return None
        reports = (AdapterReport.from_json(a) for a in value["adapters"])
        return ShardContent(
            datetime.fromisoformat(str(value["update_time"])), {a.name: a for a in reports}
        )
    except (ValueError, KeyError, TypeError):
        log.warning("status.corrupt_object what=shard")
        return None


def _counters(data: bytes) -> ReplicaCounters | None:
    value = _parse(data, "counters")
    try:
        if value is None:
            return None
        return ReplicaCounters(
            replica_id=str(value["replica_id"]),
            epoch=str(value["epoch"]),
            ttft_bounds=tuple(float(b) for b in value["ttft_bounds"]),
            counters=tuple(RevisionCounters.from_json(c) for c in value["counters"]),
        )
    except (ValueError, KeyError, TypeError):
        log.warning("status.corrupt_object what=counters")
        return None


def encode_token(adapter_name: str, position: tuple[str, str]) -> str:
    return pagetokens.encode_token(f"{adapter_name}:{position[0]}/{position[1]}")


def decode_token(token: str, adapter_name: str) -> tuple[str, str]:
    """The (adapter, replica) the previous page ended with; ("", "") for the first."""
    value = pagetokens.decode_token(token, "GetAdapterStatus")
    if not value:
        return "", ""
    name, sep, position = value.partition(":")
    last_name, slash, replica = position.partition("/")
    if not sep or not slash or not last_name or not replica:
        raise InvalidArgument("invalid page_token for GetAdapterStatus")
    if name != adapter_name or (adapter_name and last_name != adapter_name):
        raise InvalidArgument(
            "page_token for GetAdapterStatus was made for another name; ask from the first page"
        )
    return last_name, replica
