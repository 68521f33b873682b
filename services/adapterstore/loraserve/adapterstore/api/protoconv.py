"""Conversions between the store's domain objects and its protobuf messages."""

from __future__ import annotations

from loraserve.adapterstore.catalog import (
    Adapter,
    Change,
    ChangeType,
    QuotaChange,
    YankChange,
    YankMark,
)
from loraserve.adapterstore.changelog import Heartbeat
from loraserve.adapterstore.files import Chunk, PushHeader
from loraserve.adapterstore.replicas.model import (
    Liveness,
    ReplicaCounters,
    ReplicaReport,
    ReplicaStatus,
    Shard,
)
from loraserve.adapterstore.rollout.protoconv import rollout
from loraserve.adapterstore.rollout.records import Rollout
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.errors import InvalidArgument
from loraserve.common.fleet.reports import (
    SERVING_STATES_PB,
    AdapterReport,
    ReplicaError,
    RevisionCounters,
    RevisionReport,
    ServingState,
)
from loraserve.common.quota import quota_to_proto
from loraserve.common.revisions.manifest import FileInfo, Revision, revision_to_proto, timestamp
from loraserve.common.revisions.presigned import RevisionUrls

_EVENT_TYPES = {
    ChangeType.REVISION_PUSHED: pb.EVENT_TYPE_REVISION_PUSHED,
    ChangeType.CURRENT_REVISION_SET: pb.EVENT_TYPE_CURRENT_REVISION_SET,
    ChangeType.ADAPTER_DELETED: pb.EVENT_TYPE_ADAPTER_DELETED,
    ChangeType.ROLLOUT_CHANGED: pb.EVENT_TYPE_ROLLOUT_CHANGED,
    ChangeType.QUOTA_SET: pb.EVENT_TYPE_QUOTA_CHANGED,
    ChangeType.YANK_SET: pb.EVENT_TYPE_YANK_CHANGED,
}
_SERVING_STATES_FROM_PB = {v: k for k, v in SERVING_STATES_PB.items()}
_LIVENESS = {Liveness.LIVE: pb.REPLICA_LIVENESS_LIVE, Liveness.STALE: pb.REPLICA_LIVENESS_STALE}


def adapter(value: Adapter) -> pb.Adapter:
    message = pb.Adapter(
        name=value.name,
        current_revision=value.current_revision,
        latest_revision=value.latest_revision,
        create_time=timestamp(value.create_time),
        update_time=timestamp(value.update_time),
        create_seq=value.create_seq,
    )
    if value.current is not None:
        message.current.CopyFrom(revision_to_proto(value.current))
    if value.rollout is not None:
        candidate = value.revisions[value.rollout.candidate_revision]
        message.rollout.CopyFrom(rollout(value.rollout, candidate))
    if value.quota is not None:
        message.quota.CopyFrom(quota_to_proto(value.quota))
    message.yanked_revisions.extend(revision_yank(n, m) for n, m in sorted(value.yanks.items()))
    return message


def revision_yank(revision: int, mark: YankMark) -> pb.RevisionYank:
    return pb.RevisionYank(
        revision=revision,
        reason=mark.reason,
        yanked_by=mark.yanked_by,
        yank_time=timestamp(mark.time),
        seq=mark.seq,
    )


def event(value: Change) -> pb.AdapterEvent:
    message = pb.AdapterEvent(
        seq=value.seq,
        type=_EVENT_TYPES[value.type],
        adapter_name=value.adapter_name,
        current_revision=value.current_revision,
        time=timestamp(value.time),
        actor=value.actor,
        trace_parent=value.trace_parent,
    )
    if value.revision is not None:
        message.revision.CopyFrom(revision_to_proto(value.revision))
    if isinstance(value.record, Rollout) and value.revision is not None:
        message.rollout.CopyFrom(rollout(value.record, value.revision))
    if isinstance(value.record, QuotaChange) and value.record.quota is not None:
        message.quota.CopyFrom(quota_to_proto(value.record.quota))
    if isinstance(value.record, YankChange) and value.record.mark is not None:
        message.yank.CopyFrom(revision_yank(message.revision.revision, value.record.mark))
    return message


def watch_response(value: Change | Heartbeat) -> pb.WatchAdaptersResponse:
    if isinstance(value, Heartbeat):
        return pb.WatchAdaptersResponse(
            heartbeat=pb.Heartbeat(
                seq=value.seq,
                time=timestamp(value.time),
                synced_time=timestamp(value.synced_time),
                incarnation=value.incarnation,
            )
        )
    return pb.WatchAdaptersResponse(event=event(value))


def download_response(value: Revision | Chunk) -> pb.DownloadAdapterResponse:
    if isinstance(value, Revision):
        return pb.DownloadAdapterResponse(manifest=revision_to_proto(value))
    return pb.DownloadAdapterResponse(
        chunk=pb.FileChunk(file_name=value.file_name, offset=value.offset, data=value.data)
    )


def download_urls(value: RevisionUrls) -> pb.GetDownloadUrlsResponse:
    return pb.GetDownloadUrlsResponse(
        manifest=revision_to_proto(value.manifest),
        urls=[pb.FileUrl(file_name=u.name, url=u.url) for u in value.urls],
        expire_time=timestamp(value.expire_time),
    )


def push_header(message: pb.PushAdapterRequest) -> PushHeader:
    if message.WhichOneof("message") != "header":
        raise InvalidArgument("the first message of a push must be its header")
    header = message.header
    return PushHeader(
        name=header.name,
        files=[FileInfo(f.name, f.size, f.sha256) for f in header.files],
        no_promote=header.no_promote,
        description=header.description,
        idempotency_key=header.idempotency_key,
        signature=header.signature,
    )


def push_chunk(message: pb.PushAdapterRequest) -> Chunk:
    if message.WhichOneof("message") != "chunk":
        raise InvalidArgument("a push has exactly one header, in its first message")
    chunk = message.chunk
    return Chunk(chunk.file_name, chunk.offset, chunk.data)


def replica_report(message: pb.ReportReplicaStatusRequest) -> ReplicaReport:
    counters = None
    if message.counters or message.counters_epoch:
        counters = ReplicaCounters(
            replica_id=message.replica_id,
            epoch=message.counters_epoch,
            ttft_bounds=tuple(message.ttft_bounds_seconds),
            counters=tuple(RevisionCounters.from_proto(c) for c in message.counters),
        )
    return ReplicaReport(
        replica_id=message.replica_id,
        applied_seq=message.applied_seq,
        incarnation=message.incarnation,
        interval_s=message.report_interval_seconds,
        shards=tuple(
            Shard(shard.index, tuple(_adapter_report(a) for a in shard.adapters))
            for shard in message.shards
        ),
        counters=counters,
    )


def _adapter_report(message: pb.AdapterReport) -> AdapterReport:
    revisions = []
    for r in message.revisions:
        state = _SERVING_STATES_FROM_PB.get(r.state)
        if state is None:
            raise InvalidArgument(
                f"{message.adapter_name}@{r.revision}: state must be ROUTED, LOADING, "
                "LOADED or FAILED"
            )
        error = ReplicaError(r.error.code, r.error.message) if r.HasField("error") else None
        revisions.append(RevisionReport(r.revision, state, error, r.candidate))
    return AdapterReport(message.adapter_name, message.serving_revision, tuple(revisions))


def replica_status(value: ReplicaStatus) -> pb.ReplicaAdapterStatus:
    """A replica's status of one adapter; the fields of single reports (type,
    reported_revision, last_error) say what its newest revision came to."""
    message = pb.ReplicaAdapterStatus(
        replica_id=value.replica_id,
        adapter_name=value.adapter_name,
        liveness=_LIVENESS[value.liveness],
        applied_seq=value.seen.applied_seq,
        seen_time=timestamp(value.seen.seen_time),
    )
    report = value.report
    if value.update_time is not None:
        message.update_time.CopyFrom(timestamp(value.update_time))
    if report is None:
        return message
    message.serving_revision = report.serving_revision
    for r in report.revisions:
        status = message.revisions.add(revision=r.revision, state=SERVING_STATES_PB[r.state])
        status.candidate = r.candidate
        if r.error is not None:
            status.error.CopyFrom(pb.ErrorStatus(code=r.error.code, message=r.error.message))
    newest = max(report.revisions, key=lambda r: r.revision, default=None)
    if newest is not None:
        message.reported_revision = newest.revision
        if newest.state is ServingState.FAILED:
            message.type = pb.REPORT_TYPE_NACK
        elif newest.answered:
            message.type = pb.REPORT_TYPE_ACK
    failed = [r for r in report.revisions if r.error is not None]
    if failed:
        error = max(failed, key=lambda r: r.revision).error
        assert error is not None
        message.last_error.CopyFrom(pb.ErrorStatus(code=error.code, message=error.message))
    return message
