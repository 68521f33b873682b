import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EventType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_TYPE_UNSPECIFIED: _ClassVar[EventType]
    EVENT_TYPE_REVISION_PUSHED: _ClassVar[EventType]
    EVENT_TYPE_CURRENT_REVISION_SET: _ClassVar[EventType]
    EVENT_TYPE_ADAPTER_DELETED: _ClassVar[EventType]
    EVENT_TYPE_ROLLOUT_CHANGED: _ClassVar[EventType]
    EVENT_TYPE_QUOTA_CHANGED: _ClassVar[EventType]
    EVENT_TYPE_YANK_CHANGED: _ClassVar[EventType]

class ReportType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPORT_TYPE_UNSPECIFIED: _ClassVar[ReportType]
    REPORT_TYPE_ACK: _ClassVar[ReportType]
    REPORT_TYPE_NACK: _ClassVar[ReportType]
    REPORT_TYPE_REMOVED: _ClassVar[ReportType]

class ReplicaLiveness(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_LIVENESS_UNSPECIFIED: _ClassVar[ReplicaLiveness]
    REPLICA_LIVENESS_LIVE: _ClassVar[ReplicaLiveness]
    REPLICA_LIVENESS_STALE: _ClassVar[ReplicaLiveness]

class RevisionServingState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REVISION_SERVING_STATE_UNSPECIFIED: _ClassVar[RevisionServingState]
    REVISION_SERVING_STATE_ROUTED: _ClassVar[RevisionServingState]
    REVISION_SERVING_STATE_LOADING: _ClassVar[RevisionServingState]
    REVISION_SERVING_STATE_LOADED: _ClassVar[RevisionServingState]
    REVISION_SERVING_STATE_FAILED: _ClassVar[RevisionServingState]

class RolloutState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLLOUT_STATE_UNSPECIFIED: _ClassVar[RolloutState]
    ROLLOUT_STATE_ACTIVE: _ClassVar[RolloutState]
    ROLLOUT_STATE_PROMOTED: _ClassVar[RolloutState]
    ROLLOUT_STATE_ABORTED: _ClassVar[RolloutState]
EVENT_TYPE_UNSPECIFIED: EventType
EVENT_TYPE_REVISION_PUSHED: EventType
EVENT_TYPE_CURRENT_REVISION_SET: EventType
EVENT_TYPE_ADAPTER_DELETED: EventType
EVENT_TYPE_ROLLOUT_CHANGED: EventType
EVENT_TYPE_QUOTA_CHANGED: EventType
EVENT_TYPE_YANK_CHANGED: EventType
REPORT_TYPE_UNSPECIFIED: ReportType
REPORT_TYPE_ACK: ReportType
REPORT_TYPE_NACK: ReportType
REPORT_TYPE_REMOVED: ReportType
REPLICA_LIVENESS_UNSPECIFIED: ReplicaLiveness
REPLICA_LIVENESS_LIVE: ReplicaLiveness
REPLICA_LIVENESS_STALE: ReplicaLiveness
REVISION_SERVING_STATE_UNSPECIFIED: RevisionServingState
REVISION_SERVING_STATE_ROUTED: RevisionServingState
REVISION_SERVING_STATE_LOADING: RevisionServingState
REVISION_SERVING_STATE_LOADED: RevisionServingState
REVISION_SERVING_STATE_FAILED: RevisionServingState
ROLLOUT_STATE_UNSPECIFIED: RolloutState
ROLLOUT_STATE_ACTIVE: RolloutState
ROLLOUT_STATE_PROMOTED: RolloutState
ROLLOUT_STATE_ABORTED: RolloutState

class FileInfo(_message.Message):
    __slots__ = ("name", "size", "sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    size: int
    sha256: str
    def __init__(self, name: _Optional[str] = ..., size: _Optional[int] = ..., sha256: _Optional[str] = ...) -> None: ...

class Revision(_message.Message):
    __slots__ = ("adapter_name", "revision", "files", "base_model", "rank", "alpha", "target_modules", "create_time", "pushed_by", "description", "seq", "signature", "signed_by", "withheld_fields")
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ALPHA_FIELD_NUMBER: _ClassVar[int]
    TARGET_MODULES_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    PUSHED_BY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    SIGNED_BY_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FIELDS_FIELD_NUMBER: _ClassVar[int]
    adapter_name: str
    revision: int
    files: _containers.RepeatedCompositeFieldContainer[FileInfo]
    base_model: str
    rank: int
    alpha: float
    target_modules: _containers.RepeatedScalarFieldContainer[str]
    create_time: _timestamp_pb2.Timestamp
    pushed_by: str
    description: str
    seq: int
    signature: bytes
    signed_by: str
    withheld_fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, adapter_name: _Optional[str] = ..., revision: _Optional[int] = ..., files: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., base_model: _Optional[str] = ..., rank: _Optional[int] = ..., alpha: _Optional[float] = ..., target_modules: _Optional[_Iterable[str]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pushed_by: _Optional[str] = ..., description: _Optional[str] = ..., seq: _Optional[int] = ..., signature: _Optional[bytes] = ..., signed_by: _Optional[str] = ..., withheld_fields: _Optional[_Iterable[str]] = ...) -> None: ...

class Adapter(_message.Message):
    __slots__ = ("name", "current_revision", "latest_revision", "current", "create_time", "update_time", "create_seq", "rollout", "quota", "yanked_revisions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REVISION_FIELD_NUMBER: _ClassVar[int]
    LATEST_REVISION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    CREATE_SEQ_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    YANKED_REVISIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    current_revision: int
    latest_revision: int
    current: Revision
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    create_seq: int
    rollout: Rollout
    quota: AdapterQuota
    yanked_revisions: _containers.RepeatedCompositeFieldContainer[RevisionYank]
    def __init__(self, name: _Optional[str] = ..., current_revision: _Optional[int] = ..., latest_revision: _Optional[int] = ..., current: _Optional[_Union[Revision, _Mapping]] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., create_seq: _Optional[int] = ..., rollout: _Optional[_Union[Rollout, _Mapping]] = ..., quota: _Optional[_Union[AdapterQuota, _Mapping]] = ..., yanked_revisions: _Optional[_Iterable[_Union[RevisionYank, _Mapping]]] = ...) -> None: ...

class PushHeader(_message.Message):
    __slots__ = ("name", "files", "no_promote", "description", "idempotency_key", "signature")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    NO_PROMOTE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    name: str
    files: _containers.RepeatedCompositeFieldContainer[FileInfo]
    no_promote: bool
    description: str
    idempotency_key: str
    signature: bytes
    def __init__(self, name: _Optional[str] = ..., files: _Optional[_Iterable[_Union[FileInfo, _Mapping]]] = ..., no_promote: _Optional[bool] = ..., description: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., signature: _Optional[bytes] = ...) -> None: ...

class FileChunk(_message.Message):
    __slots__ = ("file_name", "offset", "data")
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    file_name: str
    offset: int
    data: bytes
    def __init__(self, file_name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class PushAdapterRequest(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PushHeader
    chunk: FileChunk
    def __init__(self, header: _Optional[_Union[PushHeader, _Mapping]] = ..., chunk: _Optional[_Union[FileChunk, _Mapping]] = ...) -> None: ...

class PushAdapterResponse(_message.Message):
    __slots__ = ("revision", "promoted", "seq")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PROMOTED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    revision: Revision
    promoted: bool
    seq: int
    def __init__(self, revision: _Optional[_Union[Revision, _Mapping]] = ..., promoted: _Optional[bool] = ..., seq: _Optional[int] = ...) -> None: ...

class GetAdapterRequest(_message.Message):
    __slots__ = ("name", "revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class GetAdapterResponse(_message.Message):
    __slots__ = ("adapter", "revision")
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    adapter: Adapter
    revision: Revision
    def __init__(self, adapter: _Optional[_Union[Adapter, _Mapping]] = ..., revision: _Optional[_Union[Revision, _Mapping]] = ...) -> None: ...

class GetNextRevisionRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetNextRevisionResponse(_message.Message):
    __slots__ = ("revision",)
    REVISION_FIELD_NUMBER: _ClassVar[int]
    revision: int
    def __init__(self, revision: _Optional[int] = ...) -> None: ...

class ListAdaptersRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "base_model")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    base_model: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., base_model: _Optional[str] = ...) -> None: ...

class ListAdaptersResponse(_message.Message):
    __slots__ = ("adapters", "next_page_token", "seq", "incarnation", "default_quota")
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_QUOTA_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedCompositeFieldContainer[Adapter]
    next_page_token: str
    seq: int
    incarnation: str
    default_quota: AdapterQuota
    def __init__(self, adapters: _Optional[_Iterable[_Union[Adapter, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., seq: _Optional[int] = ..., incarnation: _Optional[str] = ..., default_quota: _Optional[_Union[AdapterQuota, _Mapping]] = ...) -> None: ...

class ListRevisionsRequest(_message.Message):
    __slots__ = ("name", "page_size", "page_token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    page_size: int
    page_token: str
    def __init__(self, name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRevisionsResponse(_message.Message):
    __slots__ = ("revisions", "next_page_token", "current_revision", "yanks")
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REVISION_FIELD_NUMBER: _ClassVar[int]
    YANKS_FIELD_NUMBER: _ClassVar[int]
    revisions: _containers.RepeatedCompositeFieldContainer[Revision]
    next_page_token: str
    current_revision: int
    yanks: _containers.RepeatedCompositeFieldContainer[RevisionYank]
    def __init__(self, revisions: _Optional[_Iterable[_Union[Revision, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., current_revision: _Optional[int] = ..., yanks: _Optional[_Iterable[_Union[RevisionYank, _Mapping]]] = ...) -> None: ...

class SetCurrentRevisionRequest(_message.Message):
    __slots__ = ("name", "revision", "expected_current_revision", "idempotency_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CURRENT_REVISION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    expected_current_revision: int
    idempotency_key: str
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ..., expected_current_revision: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class SetCurrentRevisionResponse(_message.Message):
    __slots__ = ("adapter", "seq")
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    adapter: Adapter
    seq: int
    def __init__(self, adapter: _Optional[_Union[Adapter, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class DeleteAdapterRequest(_message.Message):
    __slots__ = ("name", "idempotency_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    idempotency_key: str
    def __init__(self, name: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class DeleteAdapterResponse(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class DownloadAdapterRequest(_message.Message):
    __slots__ = ("name", "revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class DownloadAdapterResponse(_message.Message):
    __slots__ = ("manifest", "chunk")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    manifest: Revision
    chunk: FileChunk
    def __init__(self, manifest: _Optional[_Union[Revision, _Mapping]] = ..., chunk: _Optional[_Union[FileChunk, _Mapping]] = ...) -> None: ...

class GetDownloadUrlsRequest(_message.Message):
    __slots__ = ("name", "revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class FileUrl(_message.Message):
    __slots__ = ("file_name", "url")
    FILE_NAME_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    file_name: str
    url: str
    def __init__(self, file_name: _Optional[str] = ..., url: _Optional[str] = ...) -> None: ...

class GetDownloadUrlsResponse(_message.Message):
    __slots__ = ("manifest", "urls", "expire_time")
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    URLS_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIME_FIELD_NUMBER: _ClassVar[int]
    manifest: Revision
    urls: _containers.RepeatedCompositeFieldContainer[FileUrl]
    expire_time: _timestamp_pb2.Timestamp
    def __init__(self, manifest: _Optional[_Union[Revision, _Mapping]] = ..., urls: _Optional[_Iterable[_Union[FileUrl, _Mapping]]] = ..., expire_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WatchAdaptersRequest(_message.Message):
    __slots__ = ("after_seq", "incarnation")
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    after_seq: int
    incarnation: str
    def __init__(self, after_seq: _Optional[int] = ..., incarnation: _Optional[str] = ...) -> None: ...

class AdapterEvent(_message.Message):
    __slots__ = ("seq", "type", "adapter_name", "revision", "current_revision", "time", "actor", "rollout", "quota", "yank", "trace_parent")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REVISION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    ACTOR_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    YANK_FIELD_NUMBER: _ClassVar[int]
    TRACE_PARENT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    type: EventType
    adapter_name: str
    revision: Revision
    current_revision: int
    time: _timestamp_pb2.Timestamp
    actor: str
    rollout: Rollout
    quota: AdapterQuota
    yank: RevisionYank
    trace_parent: str
    def __init__(self, seq: _Optional[int] = ..., type: _Optional[_Union[EventType, str]] = ..., adapter_name: _Optional[str] = ..., revision: _Optional[_Union[Revision, _Mapping]] = ..., current_revision: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., actor: _Optional[str] = ..., rollout: _Optional[_Union[Rollout, _Mapping]] = ..., quota: _Optional[_Union[AdapterQuota, _Mapping]] = ..., yank: _Optional[_Union[RevisionYank, _Mapping]] = ..., trace_parent: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "time", "synced_time", "incarnation")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SYNCED_TIME_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    seq: int
    time: _timestamp_pb2.Timestamp
    synced_time: _timestamp_pb2.Timestamp
    incarnation: str
    def __init__(self, seq: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., synced_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., incarnation: _Optional[str] = ...) -> None: ...

class WatchAdaptersResponse(_message.Message):
    __slots__ = ("event", "heartbeat")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    event: AdapterEvent
    heartbeat: Heartbeat
    def __init__(self, event: _Optional[_Union[AdapterEvent, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ...) -> None: ...

class ErrorStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ReportStatusRequest(_message.Message):
    __slots__ = ("replica_id", "adapter_name", "revision", "type", "error", "serving_revision")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SERVING_REVISION_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    adapter_name: str
    revision: int
    type: ReportType
    error: ErrorStatus
    serving_revision: int
    def __init__(self, replica_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., revision: _Optional[int] = ..., type: _Optional[_Union[ReportType, str]] = ..., error: _Optional[_Union[ErrorStatus, _Mapping]] = ..., serving_revision: _Optional[int] = ...) -> None: ...

class ReportStatusResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReportReplicaAliveRequest(_message.Message):
    __slots__ = ("replica_id",)
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    def __init__(self, replica_id: _Optional[str] = ...) -> None: ...

class ReportReplicaAliveResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class GetAdapterStatusRequest(_message.Message):
    __slots__ = ("name", "page_size", "page_token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    page_size: int
    page_token: str
    def __init__(self, name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ReplicaAdapterStatus(_message.Message):
    __slots__ = ("replica_id", "adapter_name", "serving_revision", "reported_revision", "type", "last_error", "update_time", "revisions", "liveness", "applied_seq", "seen_time")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    SERVING_REVISION_FIELD_NUMBER: _ClassVar[int]
    REPORTED_REVISION_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    SEEN_TIME_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    adapter_name: str
    serving_revision: int
    reported_revision: int
    type: ReportType
    last_error: ErrorStatus
    update_time: _timestamp_pb2.Timestamp
    revisions: _containers.RepeatedCompositeFieldContainer[RevisionStatus]
    liveness: ReplicaLiveness
    applied_seq: int
    seen_time: _timestamp_pb2.Timestamp
    def __init__(self, replica_id: _Optional[str] = ..., adapter_name: _Optional[str] = ..., serving_revision: _Optional[int] = ..., reported_revision: _Optional[int] = ..., type: _Optional[_Union[ReportType, str]] = ..., last_error: _Optional[_Union[ErrorStatus, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., revisions: _Optional[_Iterable[_Union[RevisionStatus, _Mapping]]] = ..., liveness: _Optional[_Union[ReplicaLiveness, str]] = ..., applied_seq: _Optional[int] = ..., seen_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RevisionStatus(_message.Message):
    __slots__ = ("revision", "state", "error", "candidate")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    revision: int
    state: RevisionServingState
    error: ErrorStatus
    candidate: bool
    def __init__(self, revision: _Optional[int] = ..., state: _Optional[_Union[RevisionServingState, str]] = ..., error: _Optional[_Union[ErrorStatus, _Mapping]] = ..., candidate: _Optional[bool] = ...) -> None: ...

class GetAdapterStatusResponse(_message.Message):
    __slots__ = ("statuses", "next_page_token")
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    statuses: _containers.RepeatedCompositeFieldContainer[ReplicaAdapterStatus]
    next_page_token: str
    def __init__(self, statuses: _Optional[_Iterable[_Union[ReplicaAdapterStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AdapterReport(_message.Message):
    __slots__ = ("adapter_name", "serving_revision", "revisions")
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    SERVING_REVISION_FIELD_NUMBER: _ClassVar[int]
    REVISIONS_FIELD_NUMBER: _ClassVar[int]
    adapter_name: str
    serving_revision: int
    revisions: _containers.RepeatedCompositeFieldContainer[RevisionStatus]
    def __init__(self, adapter_name: _Optional[str] = ..., serving_revision: _Optional[int] = ..., revisions: _Optional[_Iterable[_Union[RevisionStatus, _Mapping]]] = ...) -> None: ...

class StatusShard(_message.Message):
    __slots__ = ("index", "adapters")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    index: int
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterReport]
    def __init__(self, index: _Optional[int] = ..., adapters: _Optional[_Iterable[_Union[AdapterReport, _Mapping]]] = ...) -> None: ...

class RevisionCounters(_message.Message):
    __slots__ = ("adapter_name", "revision", "requests", "errors", "generated_tokens", "ttft_buckets", "callers")
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    CALLERS_FIELD_NUMBER: _ClassVar[int]
    adapter_name: str
    revision: int
    requests: int
    errors: int
    generated_tokens: int
    ttft_buckets: _containers.RepeatedScalarFieldContainer[int]
    callers: _containers.RepeatedCompositeFieldContainer[CallerSighting]
    def __init__(self, adapter_name: _Optional[str] = ..., revision: _Optional[int] = ..., requests: _Optional[int] = ..., errors: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., ttft_buckets: _Optional[_Iterable[int]] = ..., callers: _Optional[_Iterable[_Union[CallerSighting, _Mapping]]] = ...) -> None: ...

class CallerSighting(_message.Message):
    __slots__ = ("caller", "last_request")
    CALLER_FIELD_NUMBER: _ClassVar[int]
    LAST_REQUEST_FIELD_NUMBER: _ClassVar[int]
    caller: int
    last_request: int
    def __init__(self, caller: _Optional[int] = ..., last_request: _Optional[int] = ...) -> None: ...

class ReportReplicaStatusRequest(_message.Message):
    __slots__ = ("replica_id", "applied_seq", "incarnation", "report_interval_seconds", "shards", "counters", "counters_epoch", "ttft_bounds_seconds")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    APPLIED_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TTFT_BOUNDS_SECONDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    applied_seq: int
    incarnation: str
    report_interval_seconds: float
    shards: _containers.RepeatedCompositeFieldContainer[StatusShard]
    counters: _containers.RepeatedCompositeFieldContainer[RevisionCounters]
    counters_epoch: str
    ttft_bounds_seconds: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, replica_id: _Optional[str] = ..., applied_seq: _Optional[int] = ..., incarnation: _Optional[str] = ..., report_interval_seconds: _Optional[float] = ..., shards: _Optional[_Iterable[_Union[StatusShard, _Mapping]]] = ..., counters: _Optional[_Iterable[_Union[RevisionCounters, _Mapping]]] = ..., counters_epoch: _Optional[str] = ..., ttft_bounds_seconds: _Optional[_Iterable[float]] = ...) -> None: ...

class ReportReplicaStatusResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class RolloutGuards(_message.Message):
    __slots__ = ("abort_on_nack", "max_error_rate_margin", "max_ttft_p95_margin", "window_seconds", "min_requests", "min_callers")
    ABORT_ON_NACK_FIELD_NUMBER: _ClassVar[int]
    MAX_ERROR_RATE_MARGIN_FIELD_NUMBER: _ClassVar[int]
    MAX_TTFT_P95_MARGIN_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    MIN_CALLERS_FIELD_NUMBER: _ClassVar[int]
    abort_on_nack: bool
    max_error_rate_margin: float
    max_ttft_p95_margin: float
    window_seconds: float
    min_requests: int
    min_callers: int
    def __init__(self, abort_on_nack: _Optional[bool] = ..., max_error_rate_margin: _Optional[float] = ..., max_ttft_p95_margin: _Optional[float] = ..., window_seconds: _Optional[float] = ..., min_requests: _Optional[int] = ..., min_callers: _Optional[int] = ...) -> None: ...

class ArmFigures(_message.Message):
    __slots__ = ("revision", "requests", "errors", "error_rate", "ttft_p95_seconds", "generated_tokens", "callers")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    ERROR_RATE_FIELD_NUMBER: _ClassVar[int]
    TTFT_P95_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CALLERS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    requests: int
    errors: int
    error_rate: float
    ttft_p95_seconds: float
    generated_tokens: int
    callers: int
    def __init__(self, revision: _Optional[int] = ..., requests: _Optional[int] = ..., errors: _Optional[int] = ..., error_rate: _Optional[float] = ..., ttft_p95_seconds: _Optional[float] = ..., generated_tokens: _Optional[int] = ..., callers: _Optional[int] = ...) -> None: ...

class Rollout(_message.Message):
    __slots__ = ("adapter_name", "candidate_revision", "current_revision", "weight", "state", "guards", "start_seq", "update_seq", "start_time", "update_time", "started_by", "updated_by", "end_reason", "final_figures", "candidate")
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    CURRENT_REVISION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GUARDS_FIELD_NUMBER: _ClassVar[int]
    START_SEQ_FIELD_NUMBER: _ClassVar[int]
    UPDATE_SEQ_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    STARTED_BY_FIELD_NUMBER: _ClassVar[int]
    UPDATED_BY_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIGURES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    adapter_name: str
    candidate_revision: int
    current_revision: int
    weight: float
    state: RolloutState
    guards: RolloutGuards
    start_seq: int
    update_seq: int
    start_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    started_by: str
    updated_by: str
    end_reason: str
    final_figures: _containers.RepeatedCompositeFieldContainer[ArmFigures]
    candidate: Revision
    def __init__(self, adapter_name: _Optional[str] = ..., candidate_revision: _Optional[int] = ..., current_revision: _Optional[int] = ..., weight: _Optional[float] = ..., state: _Optional[_Union[RolloutState, str]] = ..., guards: _Optional[_Union[RolloutGuards, _Mapping]] = ..., start_seq: _Optional[int] = ..., update_seq: _Optional[int] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_by: _Optional[str] = ..., updated_by: _Optional[str] = ..., end_reason: _Optional[str] = ..., final_figures: _Optional[_Iterable[_Union[ArmFigures, _Mapping]]] = ..., candidate: _Optional[_Union[Revision, _Mapping]] = ...) -> None: ...

class StartRolloutRequest(_message.Message):
    __slots__ = ("name", "revision", "weight", "guards", "idempotency_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    GUARDS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    weight: float
    guards: RolloutGuards
    idempotency_key: str
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ..., weight: _Optional[float] = ..., guards: _Optional[_Union[RolloutGuards, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class SetRolloutWeightRequest(_message.Message):
    __slots__ = ("name", "weight", "idempotency_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    weight: float
    idempotency_key: str
    def __init__(self, name: _Optional[str] = ..., weight: _Optional[float] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class PromoteRolloutRequest(_message.Message):
    __slots__ = ("name", "idempotency_key", "expected_candidate_revision", "force")
    NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_CANDIDATE_REVISION_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    idempotency_key: str
    expected_candidate_revision: int
    force: bool
    def __init__(self, name: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., expected_candidate_revision: _Optional[int] = ..., force: _Optional[bool] = ...) -> None: ...

class AbortRolloutRequest(_message.Message):
    __slots__ = ("name", "reason", "idempotency_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    idempotency_key: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class RolloutResponse(_message.Message):
    __slots__ = ("rollout", "seq")
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    seq: int
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class GetRolloutRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ReplicaArmFigures(_message.Message):
    __slots__ = ("replica_id", "figures")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    figures: ArmFigures
    def __init__(self, replica_id: _Optional[str] = ..., figures: _Optional[_Union[ArmFigures, _Mapping]] = ...) -> None: ...

class GetRolloutResponse(_message.Message):
    __slots__ = ("rollout", "figures", "candidate_by_replica", "figures_time")
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    FIGURES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_BY_REPLICA_FIELD_NUMBER: _ClassVar[int]
    FIGURES_TIME_FIELD_NUMBER: _ClassVar[int]
    rollout: Rollout
    figures: _containers.RepeatedCompositeFieldContainer[ArmFigures]
    candidate_by_replica: _containers.RepeatedCompositeFieldContainer[ReplicaArmFigures]
    figures_time: _timestamp_pb2.Timestamp
    def __init__(self, rollout: _Optional[_Union[Rollout, _Mapping]] = ..., figures: _Optional[_Iterable[_Union[ArmFigures, _Mapping]]] = ..., candidate_by_replica: _Optional[_Iterable[_Union[ReplicaArmFigures, _Mapping]]] = ..., figures_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class AdapterQuota(_message.Message):
    __slots__ = ("max_in_flight", "tokens_per_second", "tokens_per_minute")
    MAX_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    max_in_flight: int
    tokens_per_second: float
    tokens_per_minute: float
    def __init__(self, max_in_flight: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., tokens_per_minute: _Optional[float] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("adapter_name", "quota", "idempotency_key")
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    adapter_name: str
    quota: AdapterQuota
    idempotency_key: str
    def __init__(self, adapter_name: _Optional[str] = ..., quota: _Optional[_Union[AdapterQuota, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class SetQuotaResponse(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...

class ListQuotasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NamedQuota(_message.Message):
    __slots__ = ("adapter_name", "quota")
    ADAPTER_NAME_FIELD_NUMBER: _ClassVar[int]
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    adapter_name: str
    quota: AdapterQuota
    def __init__(self, adapter_name: _Optional[str] = ..., quota: _Optional[_Union[AdapterQuota, _Mapping]] = ...) -> None: ...

class ListQuotasResponse(_message.Message):
    __slots__ = ("default_quota", "quotas", "seq")
    DEFAULT_QUOTA_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    default_quota: AdapterQuota
    quotas: _containers.RepeatedCompositeFieldContainer[NamedQuota]
    seq: int
    def __init__(self, default_quota: _Optional[_Union[AdapterQuota, _Mapping]] = ..., quotas: _Optional[_Iterable[_Union[NamedQuota, _Mapping]]] = ..., seq: _Optional[int] = ...) -> None: ...

class RevisionYank(_message.Message):
    __slots__ = ("revision", "reason", "yanked_by", "yank_time", "seq")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    YANKED_BY_FIELD_NUMBER: _ClassVar[int]
    YANK_TIME_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    revision: int
    reason: str
    yanked_by: str
    yank_time: _timestamp_pb2.Timestamp
    seq: int
    def __init__(self, revision: _Optional[int] = ..., reason: _Optional[str] = ..., yanked_by: _Optional[str] = ..., yank_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class YankRevisionRequest(_message.Message):
    __slots__ = ("name", "revision", "reason", "idempotency_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    reason: str
    idempotency_key: str
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ..., reason: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class YankRevisionResponse(_message.Message):
    __slots__ = ("yank", "seq")
    YANK_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    yank: RevisionYank
    seq: int
    def __init__(self, yank: _Optional[_Union[RevisionYank, _Mapping]] = ..., seq: _Optional[int] = ...) -> None: ...

class UnyankRevisionRequest(_message.Message):
    __slots__ = ("name", "revision", "idempotency_key")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    name: str
    revision: int
    idempotency_key: str
    def __init__(self, name: _Optional[str] = ..., revision: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class UnyankRevisionResponse(_message.Message):
    __slots__ = ("seq",)
    SEQ_FIELD_NUMBER: _ClassVar[int]
    seq: int
    def __init__(self, seq: _Optional[int] = ...) -> None: ...
