"""What an inference replica reports to the store, as typed values, and their protos.

A replica reports in batches (`StatusBatch`): the seq it has applied, the status
shards that changed (each whole: every adapter of the shard it routes), and the
counters of the revisions in a rollout. `report_requests` cuts a batch into
requests of at most MAX_REQUEST_BYTES, so a replica routing any number of adapters
stays under gRPC's message limit.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.config.textlimits import MAX_ERROR_MESSAGE_BYTES, truncate_text

# Well under gRPC's default 4 MiB receive limit.
MAX_REQUEST_BYTES = 1024 * 1024


class RevisionState(enum.Enum):
    ROUTED = pb.REVISION_SERVING_STATE_ROUTED
    LOADING = pb.REVISION_SERVING_STATE_LOADING
    LOADED = pb.REVISION_SERVING_STATE_LOADED
    FAILED = pb.REVISION_SERVING_STATE_FAILED


@dataclass(frozen=True, slots=True)
class RevisionReport:
    revision: int
    state: RevisionState
    candidate: bool = False
    # A google.rpc code and the reason; FAILED only.
    error_code: int = 0
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class AdapterReport:
    """What the replica routes of one adapter: the revision its requests go to, and
    every revision it routes or refused."""

    name: str
    serving_revision: int
    revisions: tuple[RevisionReport, ...]


@dataclass(frozen=True, slots=True)
class RevisionCounts:
    """Cumulative counts of one revision's requests since `StatusBatch.counters_epoch`."""

    name: str
    revision: int
    requests: int
    errors: int
    generated_tokens: int
    ttft_buckets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StatusBatch:
    applied_seq: int
    incarnation: str
    interval_s: float
    # Shard index -> every adapter of it the replica routes (empty: none).
    shards: Mapping[int, tuple[AdapterReport, ...]]
    counters: tuple[RevisionCounts, ...] = ()
    counters_epoch: str = ""
    ttft_bounds: tuple[float, ...] = ()


def report_requests(replica_id: str, batch: StatusBatch) -> list[pb.ReportReplicaStatusRequest]:
    """The batch as requests of at most MAX_REQUEST_BYTES (one shard always fits);
    the first carries the counters. At least one request, for the sign of life."""
    first = _request(replica_id, batch)
    if batch.counters_epoch:
        first.counters_epoch = batch.counters_epoch
        first.ttft_bounds_seconds.extend(batch.ttft_bounds)
        first.counters.extend(_counters(c) for c in batch.counters)
    requests = [first]
    size = first.ByteSize()
    for index, adapters in sorted(batch.shards.items()):
        shard = pb.StatusShard(index=index, adapters=[_adapter(a) for a in adapters])
        shard_size = shard.ByteSize()
        if size + shard_size > MAX_REQUEST_BYTES and requests[-1].shards:
            requests.append(_request(replica_id, batch))
            size = requests[-1].ByteSize()
        requests[-1].shards.append(shard)
        size += shard_size
    return requests


def _request(replica_id: str, batch: StatusBatch) -> pb.ReportReplicaStatusRequest:
    return pb.ReportReplicaStatusRequest(
        replica_id=replica_id,
        applied_seq=batch.applied_seq,
        incarnation=batch.incarnation,
        report_interval_seconds=batch.interval_s,
    )


def _adapter(report: AdapterReport) -> pb.AdapterReport:
    message = pb.AdapterReport(adapter_name=report.name, serving_revision=report.serving_revision)
    for r in report.revisions:
        status = message.revisions.add(
            revision=r.revision, state=r.state.value, candidate=r.candidate
        )
        if r.state is RevisionState.FAILED:
            status.error.code = r.error_code
            status.error.message = truncate_text(r.error_message, MAX_ERROR_MESSAGE_BYTES)
    return message


def _counters(counts: RevisionCounts) -> pb.RevisionCounters:
    return pb.RevisionCounters(
        adapter_name=counts.name,
        revision=counts.revision,
        requests=counts.requests,
        errors=counts.errors,
        generated_tokens=counts.generated_tokens,
        ttft_buckets=list(counts.ttft_buckets),
    )
