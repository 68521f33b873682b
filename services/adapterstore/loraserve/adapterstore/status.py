"""What inference replicas report about the adapters they serve, kept in object storage.

One object per (adapter, replica) at `status/<adapter>/<replica>.json`, so every
store replica answers the same. A replica reports its own adapters one at a
time, so a report is a read-merge-write without a lock: the only writer of an
object is the replica it describes.
"""

from __future__ import annotations

import asyncio
import enum
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loraserve.adapterstore.blobstore import BlobNotFound, BlobStore
from loraserve.adapterstore.model import now
from loraserve.common.errors import DataLoss, InvalidArgument
from loraserve.common.names import validate_adapter_name

STATUS_PREFIX = "status/"
_REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_READ_CONCURRENCY = 16


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


def check_report(report: Report) -> None:
    if not _REPLICA_ID.fullmatch(report.replica_id):
        raise InvalidArgument(
            f"invalid replica_id {report.replica_id!r}: must match "
            "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
        )
    validate_adapter_name(report.adapter_name)
    if report.revision < 0 or report.serving_revision < 0:
        raise InvalidArgument("revision and serving_revision must not be negative")
    if report.type is ReportType.NACK and report.error is None:
        raise InvalidArgument("a NACK must carry the error that caused it")


class ReplicaStatusStore:
    def __init__(self, blobs: BlobStore) -> None:
        self._blobs = blobs

    async def report(self, report: Report) -> ReplicaStatus:
        check_report(report)
        key = status_key(report.adapter_name, report.replica_id)
        previous = await self._read(key)
        last_error = previous.last_error if previous else None
        if report.type is ReportType.NACK:
            last_error = report.error
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
        return status

    async def get(self, adapter_name: str) -> list[ReplicaStatus]:
        """Every replica's status for one adapter, or for all adapters when the name is ""."""
        prefix = STATUS_PREFIX
        if adapter_name:
            prefix += validate_adapter_name(adapter_name) + "/"
        keys = await self._blobs.list_keys(prefix)
        limit = asyncio.Semaphore(_READ_CONCURRENCY)

        async def read(key: str) -> ReplicaStatus | None:
            async with limit:
                return await self._read(key)

        statuses = await asyncio.gather(*(read(k) for k in keys))
        return sorted(
            (s for s in statuses if s is not None),
            key=lambda s: (s.adapter_name, s.replica_id),
        )

    async def _read(self, key: str) -> ReplicaStatus | None:
        try:
            data = await self._blobs.get(key)
        except BlobNotFound:
            return None
        try:
            return ReplicaStatus.from_json(json.loads(data))
        except (ValueError, KeyError, TypeError) as e:
            raise DataLoss(f"replica status {key} is corrupt: {e}") from e
