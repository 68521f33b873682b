"""What an inference replica reports to the store, as requests.

A replica reports in batches (`StatusBatch`): the seq it has applied, the status
shards that changed (each whole: every adapter of the shard it routes), and the
counters of the revisions in a rollout; the values are the fleet's report types
(loraserve.common.fleet.reports). `report_requests` cuts a batch into
requests of at most MAX_REQUEST_BYTES, so a replica routing any number of adapters
stays under gRPC's message limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.config.textlimits import MAX_ERROR_MESSAGE_BYTES, truncate_text
from loraserve.common.fleet.reports import SERVING_STATES_PB, AdapterReport, RevisionCounters

# Well under gRPC's default 4 MiB receive limit.
MAX_REQUEST_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StatusBatch:
    applied_seq: int
    incarnation: str
    interval_s: float
    # Shard index -> every adapter of it the replica routes (empty: none).
    shards: Mapping[int, tuple[AdapterReport, ...]]
    counters: tuple[RevisionCounters, ...] = ()
    counters_epoch: str = ""
    ttft_bounds: tuple[float, ...] = ()


def report_requests(replica_id: str, batch: StatusBatch) -> list[pb.ReportReplicaStatusRequest]:
    """The batch as requests of at most MAX_REQUEST_BYTES (one shard always fits);
    the first carries the counters. At least one request, for the sign of life."""
    first = _request(replica_id, batch)
    if batch.counters_epoch:
        first.counters_epoch = batch.counters_epoch
        first.ttft_bounds_seconds.extend(batch.ttft_bounds)
        first.counters.extend(c.to_proto() for c in batch.counters)
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
            revision=r.revision, state=SERVING_STATES_PB[r.state], candidate=r.candidate
        )
        if r.error is not None:
            status.error.code = r.error.code
            status.error.message = truncate_text(r.error.message, MAX_ERROR_MESSAGE_BYTES)
    return message
