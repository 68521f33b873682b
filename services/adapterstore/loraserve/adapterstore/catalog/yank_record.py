"""A revision's yank as the change log records it: why it must not be served.

A YANK_SET entry names the revision (its manifest) and carries the yank after the
change, None once unyanked. The adapter keeps its yanks by revision number (gone with
the adapter); every store replica folds them at the same seq, every inference replica
refuses their pins from there, and a restarted replica finds them in the listing. The
current revision and an active rollout's candidate are never yanked, and a yanked
revision is never made current or rolled out (`refuse_yanked`), so a replica never
has to choose between its route and a yank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from loraserve.common.config.textlimits import KIB
from loraserve.common.errors import FailedPrecondition
from loraserve.common.revisions.manifest import time_from_json, time_to_json

if TYPE_CHECKING:
    from loraserve.adapterstore.catalog.model import Adapter

# Bytes of UTF-8 in a reason; with the count below, an adapter's yanks stay a small
# part of a listing page (every yank is on its adapter in ListAdapters).
MAX_YANK_REASON_BYTES = 1 * KIB
MAX_YANKS_PER_ADAPTER = 1000


@dataclass(frozen=True, slots=True)
class YankMark:
    """Why a revision is yanked, who yanked it, when and at which seq."""

    reason: str
    yanked_by: str
    time: datetime
    seq: int

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "yanked_by": self.yanked_by,
            "time": time_to_json(self.time),
            "seq": self.seq,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> YankMark:
        return cls(
            reason=str(data["reason"]),
            yanked_by=str(data["yanked_by"]),
            time=time_from_json(data["time"]),
            seq=int(data["seq"]),
        )


@dataclass(frozen=True, slots=True)
class YankChange:
    """A YANK_SET entry's record: the revision's yank after the change; None once
    unyanked (the revision is the change's)."""

    mark: YankMark | None

    def to_json(self) -> dict[str, Any]:
        return {"mark": None if self.mark is None else self.mark.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> YankChange:
        mark = data.get("mark")
        return cls(None if mark is None else YankMark.from_json(mark))


def yanks_to_json(yanks: Mapping[int, YankMark]) -> list[dict[str, Any]]:
    return [{"revision": number, **yanks[number].to_json()} for number in sorted(yanks)]


def yanks_from_json(data: Iterable[dict[str, Any]]) -> dict[int, YankMark]:
    return {int(item["revision"]): YankMark.from_json(item) for item in data}


def refuse_yanked(adapter: Adapter, revision: int, what: str) -> None:
    """FailedPrecondition when the revision is yanked: it must not be `what` (made
    current, rolled out) until it is unyanked."""
    mark = adapter.yanks.get(revision)
    if mark is not None:
        raise FailedPrecondition(
            f"{adapter.name}@{revision} is yanked: {mark.reason}; it cannot be {what} "
            f"until it is unyanked (adapterctl unyank {adapter.name}@{revision})"
        )
