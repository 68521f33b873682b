"""Writing what replicas report (see model.py for the objects) and answering their
signs of life.

A report writes the replica's sign of life, each shard it carries (an empty shard
deletes its object) and its counters. Entries about adapters or revisions the store
does not hold are dropped, so a replica token cannot make `adapterctl status` show
an adapter the store never had; a replica racing a delete loses nothing it needs (its
next report of that shard no longer names the adapter). A NACK's reason is kept to
its first MAX_KEPT_ERROR_MESSAGE_BYTES.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from loraserve.adapterstore.blobs import BlobStore
from loraserve.adapterstore.catalog import now
from loraserve.adapterstore.compat.formats import OLDEST_FORMAT, READ_FORMAT
from loraserve.adapterstore.replicas.model import (
    DEFAULT_STATUS_TTL_S,
    ReplicaCounters,
    ReplicaReport,
    Shard,
    SignOfLife,
    check_replica_id,
    check_report,
    counters_key,
    replica_key,
    shard_key,
)
from loraserve.adapterstore.replicas.reads import StatusReader
from loraserve.common.config.textlimits import MAX_KEPT_ERROR_MESSAGE_BYTES, truncate_text
from loraserve.common.fleet.reports import AdapterReport

log = logging.getLogger(__name__)

# Whether the store holds an adapter (revision 0) or one of its revisions.
Exists = Callable[[str, int], bool]


class ReplicaStatusStore:
    def __init__(self, blobs: BlobStore, ttl_s: float = DEFAULT_STATUS_TTL_S) -> None:
        self._blobs = blobs
        self._ttl = timedelta(seconds=ttl_s)
        self.reader = StatusReader(blobs, self._ttl)

    async def alive(self, replica_id: str) -> bool:
        """A sign of life alone (ReportReplicaAlive); False when the replica was not
        live before it, so it should report every adapter again."""
        check_replica_id(replica_id)
        previous = await self.reader.seen(replica_id)
        sign = SignOfLife(replica_id, now(), store_format=READ_FORMAT)
        if previous is not None:
            sign = replace(previous, seen_time=sign.seen_time, store_format=READ_FORMAT)
        return await self._write_sign(sign, previous)

    async def report(self, report: ReplicaReport, exists: Exists) -> bool:
        """Records a batched report; False when the replica was not live before it:
        its shards may have expired, and its next report should carry all of them."""
        check_report(report)
        previous = await self.reader.seen(report.replica_id)
        sign = SignOfLife(
            report.replica_id,
            now(),
            report.applied_seq,
            report.incarnation,
            report.interval_s,
            store_format=READ_FORMAT,
        )
        writes = [self._write_shard(report.replica_id, s, exists) for s in report.shards]
        if report.counters is not None:
            writes.append(self._write_counters(report.counters))
        await asyncio.gather(*writes)
        return await self._write_sign(sign, previous)

    async def _write_sign(self, sign: SignOfLife, previous: SignOfLife | None) -> bool:
        key = replica_key(sign.replica_id)
        await self._blobs.put(key, _encode(sign.to_json()))
        self.reader.forget(key)
        return previous is not None and sign.seen_time - previous.seen_time <= self._ttl

    async def _write_shard(self, replica_id: str, shard: Shard, exists: Exists) -> None:
        key = shard_key(shard.index, replica_id)
        adapters = [_kept(a, exists) for a in shard.adapters if exists(a.name, 0)]
        if adapters:
            data = {
                "replica_id": replica_id,
                "shard": shard.index,
                "update_time": now().isoformat(),
                "adapters": [a.to_json() for a in adapters],
            }
            await self._blobs.put(key, _encode(data))
        else:
            await self._blobs.delete([key])
        self.reader.forget(key)

    async def _write_counters(self, counters: ReplicaCounters) -> None:
        key = counters_key(counters.replica_id)
        data = {
            "replica_id": counters.replica_id,
            "epoch": counters.epoch,
            "ttft_bounds": list(counters.ttft_bounds),
            "counters": [c.to_json() for c in counters.counters],
        }
        await self._blobs.put(key, _encode(data))
        self.reader.forget(key)


def _kept(adapter: AdapterReport, exists: Exists) -> AdapterReport:
    """The revisions the store holds, each error cut to what the store keeps."""
    revisions = tuple(
        replace(
            r,
            error=replace(
                r.error, message=truncate_text(r.error.message, MAX_KEPT_ERROR_MESSAGE_BYTES)
            )
            if r.error is not None
            else None,
        )
        for r in adapter.revisions
        if exists(adapter.name, r.revision)
    )
    serving = adapter.serving_revision if exists(adapter.name, adapter.serving_revision) else 0
    return replace(adapter, revisions=revisions, serving_revision=serving)


def _encode(data: dict[str, Any]) -> bytes:
    # Nothing in a report needs a newer reader than 0.1.0 (compat/formats.py).
    return json.dumps({"format": OLDEST_FORMAT, **data}, separators=(",", ":")).encode()
