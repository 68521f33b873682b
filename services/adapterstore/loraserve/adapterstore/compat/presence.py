"""Stores announce themselves on the bucket: which release each runs and which
storage formats it reads, so every store can tell what it may write.

    stores/<store>.json   one store process: release, newest format it reads, when it
                          last said so and how often it says it

A store rewrites its own object every `--presence-interval` seconds and deletes it
when it stops; one it has not rewritten for three intervals is no longer counted,
and one older than the status TTL is deleted by whichever store sees it. Stores of
0.1.0 write none: compat/gate.py finds them by what they leave in the replicas'
signs of life.
"""

from __future__ import annotations

import json
import os
import re
import socket
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from loraserve.adapterstore.compat.formats import READ_FORMAT
from loraserve.common.release import RELEASE

STORE_PREFIX = "stores/"
# Missed announcements after which a store is no longer counted.
MISSED_INTERVALS = 3.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def new_store_id() -> str:
    """Unique per process: the host (a pod's name) and a random suffix, so a restarted
    store is a new one and never answers for its predecessor."""
    host = _UNSAFE.sub("-", socket.gethostname())[:63] or "store"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def presence_key(store_id: str) -> str:
    return f"{STORE_PREFIX}{store_id}.json"


@dataclass(frozen=True, slots=True)
class StorePresence:
    store_id: str
    release: str
    # The newest storage format this store reads.
    read_format: int
    seen_time: datetime
    interval_s: float

    @classmethod
    def now(cls, store_id: str, interval_s: float) -> StorePresence:
        return cls(store_id, RELEASE, READ_FORMAT, datetime.now(UTC), interval_s)

    def live_at(self, time: datetime) -> bool:
        return (time - self.seen_time).total_seconds() <= MISSED_INTERVALS * self.interval_s

    def to_json(self) -> dict[str, Any]:
        return {
            "format": 1,
            "store_id": self.store_id,
            "release": self.release,
            "read_format": self.read_format,
            "seen_time": self.seen_time.isoformat(),
            "interval_s": self.interval_s,
        }

    def encode(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> StorePresence:
        """Raises ValueError (or KeyError, TypeError) on anything it cannot read."""
        value = json.loads(data)
        if value.get("format") != 1:
            raise ValueError(f"unknown presence format {value.get('format')!r}")
        seen = datetime.fromisoformat(str(value["seen_time"]))
        if seen.tzinfo is None:
            raise ValueError("seen_time has no time zone")
        return cls(
            store_id=str(value["store_id"]),
            release=str(value["release"]),
            read_format=int(value["read_format"]),
            seen_time=seen,
            interval_s=float(value["interval_s"]),
        )
