"""A revision's manifest: the one description of an adapter revision.

The store writes it to its change log and snapshots (JSON), sends it in every
listing, lookup and watch event (protobuf), and an inference replica keeps it
beside the files it downloaded (JSON again), so all three read and write the
same type through the same two codecs here.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from google.protobuf.timestamp_pb2 import Timestamp

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb


def time_to_json(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def time_from_json(value: Any) -> datetime:
    return datetime.fromisoformat(str(value)).astimezone(UTC)


class RevisionKey(NamedTuple):
    """One revision of one adapter, `NAME@REVISION`: how every part names a revision."""

    name: str
    revision: int

    def __str__(self) -> str:
        return f"{self.name}@{self.revision}"


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One file of a revision; `sha256` is lower-case hex and names its blob."""

    name: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "size": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FileInfo:
        return cls(name=str(data["name"]), size=int(data["size"]), sha256=str(data["sha256"]))


@dataclass(frozen=True, slots=True)
class Revision:
    """One immutable revision of an adapter."""

    adapter_name: str
    revision: int
    files: tuple[FileInfo, ...]
    base_model: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    create_time: datetime
    pushed_by: str
    description: str
    seq: int
    # The push's model-signing bundle (loraserve.common.trust.signing); empty when unsigned.
    signature: bytes = b""
    # Who the store found had signed it at push ("" when it did not check); shown to
    # people, never trusted by a replica, which verifies `signature` itself.
    signed_by: str = ""
    # Fields the store serves empty because an older store kept them over today's
    # limits (loraserve.adapterstore.catalog.withheld); sorted.
    withheld_fields: tuple[str, ...] = ()

    @property
    def key(self) -> RevisionKey:
        return RevisionKey(self.adapter_name, self.revision)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "adapter_name": self.adapter_name,
            "revision": self.revision,
            "files": [f.to_json() for f in self.files],
            "base_model": self.base_model,
            "rank": self.rank,
            "alpha": self.alpha,
            "target_modules": list(self.target_modules),
            "create_time": time_to_json(self.create_time),
            "pushed_by": self.pushed_by,
            "description": self.description,
            "seq": self.seq,
        }
        # Only when present, so unsigned revisions encode as they did before signing.
        if self.signature:
            data["signature"] = base64.b64encode(self.signature).decode()
            data["signed_by"] = self.signed_by
        if self.withheld_fields:
            data["withheld_fields"] = list(self.withheld_fields)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Revision:
        return cls(
            adapter_name=str(data["adapter_name"]),
            revision=int(data["revision"]),
            files=tuple(FileInfo.from_json(f) for f in data["files"]),
            base_model=str(data["base_model"]),
            rank=int(data["rank"]),
            alpha=float(data["alpha"]),
            target_modules=tuple(str(m) for m in data["target_modules"]),
            create_time=time_from_json(data["create_time"]),
            pushed_by=str(data["pushed_by"]),
            description=str(data["description"]),
            seq=int(data["seq"]),
            signature=base64.b64decode(str(data.get("signature", ""))),
            signed_by=str(data.get("signed_by", "")),
            withheld_fields=tuple(str(f) for f in data.get("withheld_fields", ())),
        )


def timestamp(value: datetime) -> Timestamp:
    result = Timestamp()
    result.FromDatetime(value)
    return result


def file_to_proto(value: FileInfo) -> pb.FileInfo:
    return pb.FileInfo(name=value.name, size=value.size, sha256=value.sha256)


def revision_to_proto(value: Revision) -> pb.Revision:
    return pb.Revision(
        adapter_name=value.adapter_name,
        revision=value.revision,
        files=[file_to_proto(f) for f in value.files],
        base_model=value.base_model,
        rank=value.rank,
        alpha=value.alpha,
        target_modules=list(value.target_modules),
        create_time=timestamp(value.create_time),
        pushed_by=value.pushed_by,
        description=value.description,
        seq=value.seq,
        signature=value.signature,
        signed_by=value.signed_by,
        withheld_fields=list(value.withheld_fields),
    )


def revision_from_proto(message: pb.Revision) -> Revision:
    return Revision(
        adapter_name=message.adapter_name,
        revision=message.revision,
        files=tuple(FileInfo(f.name, f.size, f.sha256) for f in message.files),
        base_model=message.base_model,
        rank=message.rank,
        alpha=message.alpha,
        target_modules=tuple(message.target_modules),
        create_time=message.create_time.ToDatetime(UTC),
        pushed_by=message.pushed_by,
        description=message.description,
        seq=message.seq,
        signature=message.signature,
        signed_by=message.signed_by,
        withheld_fields=tuple(message.withheld_fields),
    )
