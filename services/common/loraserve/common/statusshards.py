"""Which status shard an adapter's replica statuses go in: the same in every process
and version, since replicas write shards and stores read them by it."""

from __future__ import annotations

import zlib

# Part of the contract (StatusShard in adapterstore.proto).
STATUS_SHARDS = 16


def shard_of(adapter_name: str) -> int:
    return zlib.crc32(adapter_name.encode()) % STATUS_SHARDS
