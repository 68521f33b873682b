"""Conversions between the store's domain objects and its protobuf messages."""

from __future__ import annotations

from loraserve.adapterstore.model import Adapter, Change, ChangeType
from loraserve.adapterstore.push import Chunk, PushHeader
from loraserve.adapterstore.status import ReplicaError, ReplicaStatus, Report, ReportType
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.watching import Heartbeat
from loraserve.common.errors import InvalidArgument
from loraserve.common.manifest import FileInfo, Revision, revision_to_proto, timestamp
from loraserve.common.presigned import RevisionUrls

_EVENT_TYPES = {
    ChangeType.REVISION_PUSHED: pb.EVENT_TYPE_REVISION_PUSHED,
    ChangeType.CURRENT_REVISION_SET: pb.EVENT_TYPE_CURRENT_REVISION_SET,
    ChangeType.ADAPTER_DELETED: pb.EVENT_TYPE_ADAPTER_DELETED,
}
_REPORT_TYPES = {
    ReportType.ACK: pb.REPORT_TYPE_ACK,
    ReportType.NACK: pb.REPORT_TYPE_NACK,
    ReportType.REMOVED: pb.REPORT_TYPE_REMOVED,
}
_REPORT_TYPES_FROM_PB = {v: k for k, v in _REPORT_TYPES.items()}


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
    return message


def event(value: Change) -> pb.AdapterEvent:
    message = pb.AdapterEvent(
        seq=value.seq,
        type=_EVENT_TYPES[value.type],
        adapter_name=value.adapter_name,
        current_revision=value.current_revision,
        time=timestamp(value.time),
        actor=value.actor,
    )
    if value.revision is not None:
        message.revision.CopyFrom(revision_to_proto(value.revision))
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


def report(message: pb.ReportStatusRequest) -> Report:
    report_type = _REPORT_TYPES_FROM_PB.get(message.type)
    if report_type is None:
        raise InvalidArgument("report type must be ACK, NACK or REMOVED")
    error = None
    if message.HasField("error"):
        error = ReplicaError(message.error.code, message.error.message, message.revision)
    return Report(
        replica_id=message.replica_id,
        adapter_name=message.adapter_name,
        revision=message.revision,
        type=report_type,
        error=error,
        serving_revision=message.serving_revision,
    )


def replica_status(value: ReplicaStatus) -> pb.ReplicaAdapterStatus:
    message = pb.ReplicaAdapterStatus(
        replica_id=value.replica_id,
        adapter_name=value.adapter_name,
        serving_revision=value.serving_revision,
        reported_revision=value.reported_revision,
        type=_REPORT_TYPES[value.type],
        update_time=timestamp(value.update_time),
    )
    if value.last_error is not None:
        message.last_error.CopyFrom(
            pb.ErrorStatus(code=value.last_error.code, message=value.last_error.message)
        )
    return message
