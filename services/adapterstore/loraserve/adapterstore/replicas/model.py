"""What the store makes of inference replicas' reports: a report as received, where
its parts are kept in object storage, and the checks it must pass. The report's parts
and their JSON form are the fleet's (loraserve.common.fleet.reports).

A replica reports in batches (`ReplicaReport`): its sign of life, the status shards
that changed (every adapter it routes falls in one of STATUS_SHARDS shards, by a CRC
of its name), and the counters of the revisions in a rollout. Objects (keys relative
to the store's prefix):

    replicas/<replica>.json         its sign of life: when, the seq it has applied,
                                    its report interval
    fleet/<shard:02d>/<replica>.json one shard of its statuses, written whole
    counters/<replica>.json         its rollout counters

So the store holds at most 2 + STATUS_SHARDS objects per replica, however many
adapters there are, and a report costs one write per changed shard: a fleet of
replicas routing 10,000 adapters is a handful of writes per interval. Only the
replica an object describes writes it (through any store replica), so a write needs
no lock. Writing and expiry: writes.py; reading: reads.py.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loraserve.common.config.textlimits import (
    MAX_COUNTERS,
    MAX_ERROR_MESSAGE_BYTES,
    MAX_REPORT_ID_BYTES,
    MAX_REVISIONS_PER_ADAPTER,
    MAX_ROLLOUT_CALLERS,
    MAX_TTFT_BOUNDS,
    check_text,
)
from loraserve.common.errors import InvalidArgument
from loraserve.common.fleet.reports import AdapterReport, RevisionCounters, ServingState
from loraserve.common.revisions.names import validate_adapter_name
from loraserve.common.statusshards import STATUS_SHARDS, shard_of

REPLICA_PREFIX = "replicas/"
SHARD_PREFIX = "fleet/"
COUNTERS_PREFIX = "counters/"
DEFAULT_STATUS_TTL_S = 300.0
# A replica that missed this many of its reports is shown as stale.
STALE_AFTER_INTERVALS = 2.0
_MAX_INTERVAL_S = 86_400.0
_REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_MAX_RPC_CODE = 16  # UNAUTHENTICATED, the highest google.rpc.Code


def replica_key(replica_id: str) -> str:
    return f"{REPLICA_PREFIX}{replica_id}.json"


def shard_key(shard: int, replica_id: str) -> str:
    return f"{SHARD_PREFIX}{shard:02d}/{replica_id}.json"


def counters_key(replica_id: str) -> str:
    return f"{COUNTERS_PREFIX}{replica_id}.json"


def replica_of(key: str) -> str:
    """The replica an object under any of the prefixes above describes."""
    return key.rsplit("/", 1)[-1].removesuffix(".json")


@dataclass(frozen=True, slots=True)
class Shard:
    index: int
    adapters: tuple[AdapterReport, ...]


@dataclass(frozen=True, slots=True)
class ReplicaCounters:
    """A replica's rollout counters as last reported; `epoch` names one run of them."""

    replica_id: str
    epoch: str
    ttft_bounds: tuple[float, ...]
    counters: tuple[RevisionCounters, ...]


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One batched report of a replica."""

    replica_id: str
    applied_seq: int
    incarnation: str
    interval_s: float
    shards: tuple[Shard, ...]
    counters: ReplicaCounters | None = None


@dataclass(frozen=True, slots=True)
class SignOfLife:
    replica_id: str
    seen_time: datetime
    applied_seq: int = 0
    incarnation: str = ""
    # 0 from a replica that only sends signs of life (ReportReplicaAlive).
    interval_s: float = 0.0
    # The newest storage format the store that wrote this reads; 0: a store of 0.1.0,
    # which does not say (compat/gate.py holds the bucket's format down for it).
    store_format: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "replica_id": self.replica_id,
            "seen_time": self.seen_time.isoformat(),
            "applied_seq": self.applied_seq,
            "incarnation": self.incarnation,
            "interval_s": self.interval_s,
            "store_format": self.store_format,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SignOfLife:
        return cls(
            replica_id=str(data["replica_id"]),
            seen_time=datetime.fromisoformat(str(data["seen_time"])),
            applied_seq=int(data.get("applied_seq", 0)),
            incarnation=str(data.get("incarnation", "")),
            interval_s=float(data.get("interval_s", 0.0)),
            store_format=int(data.get("store_format", 0)),
        )


class Liveness(enum.Enum):
    LIVE = "live"
    STALE = "stale"


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    """What GetAdapterStatus shows of one live replica and one adapter; `report` is
    None when the replica has not reported the adapter."""

    replica_id: str
    adapter_name: str
    liveness: Liveness
    seen: SignOfLife
    report: AdapterReport | None
    update_time: datetime | None


def check_replica_id(replica_id: str) -> None:
    if not _REPLICA_ID.fullmatch(replica_id):
        raise InvalidArgument(
            f"invalid replica_id {replica_id[:200]!r}: must match "
            "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
        )


def check_report(report: ReplicaReport) -> None:
    """INVALID_ARGUMENT naming the first thing wrong with a report."""
    check_replica_id(report.replica_id)
    if report.applied_seq < 0:
        raise InvalidArgument("applied_seq must not be negative")
    check_text("incarnation", report.incarnation, MAX_REPORT_ID_BYTES)
    if not (math.isfinite(report.interval_s) and 0 < report.interval_s <= _MAX_INTERVAL_S):
        raise InvalidArgument(
            f"report_interval_seconds must be > 0 and at most {_MAX_INTERVAL_S:g}, "
            f"got {report.interval_s}"
        )
    indexes = [s.index for s in report.shards]
    if len(set(indexes)) != len(indexes) or any(not 0 <= i < STATUS_SHARDS for i in indexes):
        raise InvalidArgument(f"shards must be distinct indexes from 0 to {STATUS_SHARDS - 1}")
    for shard in report.shards:
        names = [a.name for a in shard.adapters]
        # Each at most once, so a shard's object holds at most the store's adapters.
        if len(set(names)) != len(names):
            raise InvalidArgument(f"shard {shard.index} names an adapter more than once")
        for adapter in shard.adapters:
            _check_adapter(adapter, shard.index)
    if report.counters is not None:
        _check_counters(report.counters)


def _check_adapter(adapter: AdapterReport, shard: int) -> None:
    validate_adapter_name(adapter.name)
    if shard_of(adapter.name) != shard:
        raise InvalidArgument(f"adapter {adapter.name!r} belongs in shard {shard_of(adapter.name)}")
    if len(adapter.revisions) > MAX_REVISIONS_PER_ADAPTER:
        raise InvalidArgument(
            f"adapter {adapter.name!r}: at most {MAX_REVISIONS_PER_ADAPTER} revisions per report"
        )
    if adapter.serving_revision < 0 or any(r.revision < 1 for r in adapter.revisions):
        raise InvalidArgument(f"adapter {adapter.name!r}: revisions must be >= 1")
    for revision in adapter.revisions:
        error = revision.error
        if (revision.state is ServingState.FAILED) != (error is not None):
            raise InvalidArgument(
                f"{adapter.name}@{revision.revision}: an error comes with FAILED, and only then"
            )
        if error is not None:
            if not 0 < error.code <= _MAX_RPC_CODE:
                raise InvalidArgument(
                    f"error.code {error.code} is not a google.rpc.Code from 1 to {_MAX_RPC_CODE}"
                )
            check_text("error.message", error.message, MAX_ERROR_MESSAGE_BYTES)


def _check_counters(counters: ReplicaCounters) -> None:
    bounds = counters.ttft_bounds
    if len(counters.counters) > MAX_COUNTERS:
        raise InvalidArgument(f"at most {MAX_COUNTERS} revision counters per report")
    if (
        len(bounds) > MAX_TTFT_BOUNDS
        or any(not (math.isfinite(b) and b > 0) for b in bounds)
        or list(bounds) != sorted(set(bounds))
    ):
        raise InvalidArgument(
            f"ttft_bounds_seconds must be at most {MAX_TTFT_BOUNDS} ascending positive numbers"
        )
    check_text("counters_epoch", counters.epoch, MAX_REPORT_ID_BYTES)
    for c in counters.counters:
        validate_adapter_name(c.name)
        numbers = (c.revision, c.requests, c.errors, c.generated_tokens, *c.ttft_buckets)
        if c.revision < 1 or any(n < 0 for n in numbers) or c.errors > c.requests:
            raise InvalidArgument(f"counters of {c.name}@{c.revision} are inconsistent")
        if len(c.ttft_buckets) != len(bounds) + 1 or list(c.ttft_buckets) != sorted(c.ttft_buckets):
            raise InvalidArgument(
                f"counters of {c.name}@{c.revision}: ttft_buckets must be cumulative, one "
                "per bound and one more"
            )
        if (
            len(c.callers) > MAX_ROLLOUT_CALLERS
            or len({s.caller for s in c.callers}) != len(c.callers)
            or any(not 1 <= s.last_request <= c.requests for s in c.callers)
        ):
            raise InvalidArgument(
                f"counters of {c.name}@{c.revision}: callers must be at most "
                f"{MAX_ROLLOUT_CALLERS} distinct ones, each last seen at a request from 1 "
                "to requests"
            )
