"""The change log: commits with conditional puts, catching up with other replicas,
the Change each write makes, its objects in storage, the bucket's incarnation,
idempotency keys and watch streams."""

from loraserve.adapterstore.changelog.changes import adapter_deleted, current_set, revision_pushed
from loraserve.adapterstore.changelog.idempotency import (
    check_idempotency_key,
    push_request_tag,
    request_tag,
)
from loraserve.adapterstore.changelog.log import ChangeLog, LogSettings
from loraserve.adapterstore.changelog.logtypes import ChangeBuilder, RequestTag
from loraserve.adapterstore.changelog.watching import Heartbeat, Watches

__all__ = [
    "ChangeBuilder",
    "ChangeLog",
    "Heartbeat",
    "LogSettings",
    "RequestTag",
    "Watches",
    "adapter_deleted",
    "check_idempotency_key",
    "current_set",
    "push_request_tag",
    "request_tag",
    "revision_pushed",
]
