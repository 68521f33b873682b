"""What inference replicas report about the adapters they serve, kept in object storage.

One object per (adapter, replica) at `status/<adapter>/<replica>.json`, written only
by the replica it describes (so a read-merge-write needs no lock), and a sign of
life per replica at `replicas/<replica>.json`. Statuses expire with their replica
(docs/design.md, "Statuses expire"); a NACK's reason is kept to its first
MAX_KEPT_ERROR_MESSAGE_BYTES. Reading statuses a page at a time: statusreads.py.
"""

from __future__ import annotations

import enum
import json
import logging
import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from loraserve.adapterstore.blobstore import BlobNotFound, BlobStore
from loraserve.adapterstore.model import now
from loraserve.common.errors import DataLoss, InvalidArgument
from loraserve.common.names import validate_adapter_name
from loraserve.common.textlimits import (
    MAX_ERROR_MESSAGE_BYTES,
    MAX_KEPT_ERROR_MESSAGE_BYTES,
    check_text,
    truncate_text,
)

log = logging.getLogger(__name__)

STATUS_PREFIX = "status/"
REPLICA_PREFIX = "replicas/"
DEFAULT_STATUS_TTL_S = 300.0
_REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_MAX_RPC_CODE = 16  # UNAUTHENTICATED, the highest google.rpc.Code


class ReportType(enum.Enum):
    ACK = "ack"
    NACK = "nack"
    REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class ReplicaError:
    code: int  # a google.rpc.Code value
    message: str
    revision: int  # the revision the NACK was about


@dataclass(frozen=True, slots=True)
class Report:
    replica_id: str
    adapter_name: str
    revision: int
    type: ReportType
    error: ReplicaError | None
    serving_revision: int


@dataclass(frozen=True, slots=True)
class ReplicaStatus:
    replica_id: str
    adapter_name: str
    serving_revision: int
    reported_revision: int
    type: ReportType
    last_error: ReplicaError | None
    update_time: datetime

    def to_json(self) -> dict[str, Any]:
        error = self.last_error
        return {
            "replica_id": self.replica_id,
            "adapter_name": self.adapter_name,
            "serving_revision": self.serving_revision,
            "reported_revision": self.reported_revision,
            "type": self.type.value,
            "last_error": (
                {"code": error.code, "message": error.message, "revision": error.revision}
                if error
                else None
            ),
            "update_time": self.update_time.isoformat(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplicaStatus:
        error = data.get("last_error")
        return cls(
            replica_id=str(data["replica_id"]),
            adapter_name=str(data["adapter_name"]),
            serving_revision=int(data["serving_revision"]),
            reported_revision=int(data["reported_revision"]),
            type=ReportType(data["type"]),
            last_error=(
                ReplicaError(int(error["code"]), str(error["message"]), int(error["revision"]))
                if error
                else None
            ),
            update_time=datetime.fromisoformat(str(data["update_time"])),
        )


def status_key(adapter_name: str, replica_id: str) -> str:
    return f"{STATUS_PREFIX}{adapter_name}/{replica_id}.json"


def replica_key(replica_id: str) -> str:
    return f"{REPLICA_PREFIX}{replica_id}.json"


def check_replica_id(replica_id: str) -> None:
    if not _REPLICA_ID.fullmatch(replica_id):
        raise InvalidArgument(
            f"invalid replica_id {replica_id[:200]!r}: must match "
            "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
        )


def check_report(report: Report) -> None:
    check_replica_id(report.replica_id)
    validate_adapter_name(report.adapter_name)
    if report.revision < 0 or report.serving_revision < 0:
        raise InvalidArgument("revision and serving_revision must not be negative")
    if report.type is not ReportType.REMOVED and report.revision == 0:
        raise InvalidArgument("an ACK or NACK must name the revision it is about")
    if report.type is ReportType.NACK and report.error is None:
        raise InvalidArgument("a NACK must carry the error that caused it")
    if report.error is not None:
        if not 0 < report.error.code <= _MAX_RPC_CODE:
            raise InvalidArgument(
                f"error.code {report.error.code} is not a google.rpc.Code from 1 to {_MAX_RPC_CODE}"
            )
        check_text("error.message", report.error.message, MAX_ERROR_MESSAGE_BYTES)


async def read_status(blobs: BlobStore, key: str) -> ReplicaStatus | None:
    """The status object at `key`; None if there is none."""
    try:
        data = await blobs.get(key)
    except BlobNotFound:
        return None
    try:
        return ReplicaStatus.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as e:
        raise DataLoss(f"replica status {key} is corrupt: {e}") from e


class ReplicaStatusStore:
    def __init__(self, blobs: BlobStore, ttl_s: float = DEFAULT_STATUS_TTL_S) -> None:
        # Here, not at the top: statusreads builds on this module's types.
        from loraserve.adapterstore.statusreads import StatusReader

        self._blobs = blobs
        self._ttl = timedelta(seconds=ttl_s)
        # Pages of statuses for GetAdapterStatus (see statusreads).
        self.reader = StatusReader(blobs, self._ttl)

    async def alive(self, replica_id: str) -> bool:
        """Records a sign of life; False when the replica was not live before it,
        so its statuses may be gone and it should report its adapters again."""
        check_replica_id(replica_id)
        key = replica_key(replica_id)
        seen = await self.reader.seen_time(key)
        time = now()
        await self._blobs.put(
            key, json.dumps({"replica_id": replica_id, "seen_time": time.isoformat()}).encode()
        )
        return seen is not None and time - seen <= self._ttl

    async def report(self, report: Report) -> ReplicaStatus:
        check_report(report)
        key = status_key(report.adapter_name, report.replica_id)
        previous = await read_status(self._blobs, key)
        last_error = previous.last_error if previous else None
        if report.type is ReportType.NACK and report.error is not None:
            # Kept short: a page of statuses carries one per replica and adapter.
            message = truncate_text(report.error.message, MAX_KEPT_ERROR_MESSAGE_BYTES)
            last_error = replace(report.error, message=message)
        elif (
            report.type is ReportType.ACK
            and last_error is not None
            and report.revision >= last_error.revision
        ):
            last_error = None
        status = ReplicaStatus(
            replica_id=report.replica_id,
            adapter_name=report.adapter_name,
            serving_revision=report.serving_revision,
            reported_revision=report.revision,
            type=report.type,
            last_error=last_error,
            update_time=now(),
        )
        await self._blobs.put(key, json.dumps(status.to_json()).encode())
        self.reader.forget(key)
        return status
