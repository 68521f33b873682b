"""The store's domain model: revisions, adapters, changes, and the state folded from the log.

Everything here is plain data with a JSON form, because the change log and the
snapshots in S3 are JSON. `StoreState.apply` is the only place that decides how
a change alters the state, so a replica that replays the log gets the same state
as the replica that committed it.
"""

from __future__ import annotations

import bisect
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from loraserve.adapterstore.catalog.folds import (
    fold_current_set,
    fold_delete,
    fold_yank,
    require_revision,
)
from loraserve.adapterstore.catalog.quota_record import DEFAULT_QUOTA, QuotaChange
from loraserve.adapterstore.catalog.requestrecord import RequestRecord
from loraserve.adapterstore.catalog.yank_record import (
    YankChange,
    YankMark,
    yanks_from_json,
    yanks_to_json,
)
from loraserve.adapterstore.compat.formats import OLDEST_FORMAT, check_readable
from loraserve.adapterstore.rollout.records import Rollout, RolloutState
from loraserve.common.errors import DataLoss
from loraserve.common.quota import Quota
from loraserve.common.release import RELEASE
from loraserve.common.revisions.manifest import Revision, time_from_json, time_to_json
from loraserve.common.tracing import bounded_traceparent

# Idempotency keys are remembered for the changes of this many newest seqs. The
# window is counted in seqs, not keys or time, so every replica that folds the
# same log forgets the same keys at the same seq.
REQUEST_KEY_WINDOW = 10_000


def now() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class Adapter:
    """An adapter as folded from the log. Mutated only by `StoreState.apply`."""

    name: str
    revisions: dict[int, Revision]
    current_revision: int
    latest_revision: int
    create_time: datetime
    update_time: datetime
    # The active rollout, or the last one that ended (until the next starts).
    rollout: Rollout | None = None
    # Its own quota (QUOTA_SET), None when it follows the default.
    quota: Quota | None = None
    # Yanked revisions by number (YANK_SET): replaced on a change, never changed in place.
    yanks: dict[int, YankMark] = field(default_factory=dict)

    @property
    def current(self) -> Revision | None:
        return self.revisions.get(self.current_revision)

    @property
    def create_seq(self) -> int:
        """The adapter's incarnation: the seq of the push that created it since the
        name was last deleted (revisions, kept in push order, go only all at once)."""
        return next(iter(self.revisions.values())).seq

    @property
    def active_rollout(self) -> Rollout | None:
        return self.rollout if self.rollout is not None and self.rollout.active else None

    def to_json(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "revisions": [r.to_json() for _, r in sorted(self.revisions.items())],
            "current_revision": self.current_revision,
            "latest_revision": self.latest_revision,
            "create_time": time_to_json(self.create_time),
            "update_time": time_to_json(self.update_time),
        }
        if self.rollout is not None:
            data["rollout"] = self.rollout.to_json()
        if self.quota is not None:
            data["quota"] = self.quota.to_json()
        if self.yanks:
            data["yanks"] = yanks_to_json(self.yanks)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Adapter:
        revisions = [Revision.from_json(r) for r in data["revisions"]]
        return cls(
            name=str(data["name"]),
            revisions={r.revision: r for r in revisions},
            current_revision=int(data["current_revision"]),
            latest_revision=int(data["latest_revision"]),
            create_time=time_from_json(data["create_time"]),
            update_time=time_from_json(data["update_time"]),
            rollout=Rollout.from_json(data["rollout"]) if data.get("rollout") else None,
            quota=Quota.from_json(data["quota"]) if data.get("quota") else None,
            yanks=yanks_from_json(data.get("yanks", ())),
        )


class ChangeType(enum.Enum):
    """Kinds of change; the values are what the log stores. A kind that carries more
    than a revision has a record type in RECORD_TYPES and a fold in `_FOLDS`."""

    REVISION_PUSHED = "revision_pushed"
    CURRENT_REVISION_SET = "current_revision_set"
    ADAPTER_DELETED = "adapter_deleted"
    ROLLOUT_CHANGED = "rollout_changed"
    QUOTA_SET = "quota_set"
    YANK_SET = "yank_set"


# What a change's `record` holds, by the kinds that have one.
Record = Rollout | QuotaChange | YankChange
RECORD_TYPES: dict[ChangeType, type[Record]] = {
    ChangeType.ROLLOUT_CHANGED: Rollout,
    ChangeType.QUOTA_SET: QuotaChange,
    ChangeType.YANK_SET: YankChange,
}


@dataclass(frozen=True, slots=True)
class Change:
    """One committed change: a log entry and, at the same time, a watch event."""

    seq: int
    type: ChangeType
    adapter_name: str
    # The revision pushed or made current (a rollout's candidate); None on delete.
    revision: Revision | None
    current_revision: int  # the adapter's current revision after the change
    time: datetime
    actor: str
    # Unique per commit attempt: a writer that cannot tell whether its conditional
    # put landed reads the entry back and finds its own commit by this id.
    commit_id: str = ""
    # The client's idempotency key ("" when none was given) and a digest of the
    # request it came with, so a retry is answered with this change.
    request_key: str = ""
    request_digest: str = ""
    # What a RECORD_TYPES kind carries: the rollout or the quota after the change.
    record: Record | None = None
    # The W3C traceparent of the request that made it ("": untraced), which watchers continue.
    trace_parent: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            # Nothing in an entry needs a newer reader than 0.1.0 (compat/formats.py).
            "format": OLDEST_FORMAT,
            "seq": self.seq,
            "type": self.type.value,
            "adapter_name": self.adapter_name,
            "revision": self.revision.to_json() if self.revision is not None else None,
            "current_revision": self.current_revision,
            "time": time_to_json(self.time),
            "actor": self.actor,
            "commit_id": self.commit_id,
        }
        if self.request_key:
            data["request_key"] = self.request_key
            data["request_digest"] = self.request_digest
        if self.record is not None:
            data["record"] = self.record.to_json()
        if self.trace_parent:
            data["trace_parent"] = self.trace_parent
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Change:
        check_readable(data, "log entry")
        revision = data.get("revision")
        change_type = ChangeType(data["type"])
        record_type = RECORD_TYPES.get(change_type)
        record = data.get("record")
        return cls(
            seq=int(data["seq"]),
            type=change_type,
            adapter_name=str(data["adapter_name"]),
            revision=Revision.from_json(revision) if revision is not None else None,
            current_revision=int(data["current_revision"]),
            time=time_from_json(data["time"]),
            actor=str(data["actor"]),
            commit_id=str(data.get("commit_id", "")),
            request_key=str(data.get("request_key", "")),
            request_digest=str(data.get("request_digest", "")),
            record=record_type.from_json(record) if record_type and record else None,
            trace_parent=bounded_traceparent(str(data.get("trace_parent", ""))),
        )


@dataclass(slots=True)
class StoreState:
    """Every adapter as of `seq`, folded from the log.

    `deleted_latest` keeps the highest revision of each deleted name, so a name
    pushed again continues its numbering: NAME@N never names two contents.
    `requests` maps the idempotency keys of the last REQUEST_KEY_WINDOW seqs'
    changes to where they were committed, oldest first. Two derived indexes keep
    reads from costing the whole state: `names`, in order (a listing page is a
    bisect and a slice), and each adapter's encoded snapshot JSON, kept until a
    change touches it (a snapshot re-encodes only what changed since the last).
    """

    seq: int = 0
    adapters: dict[str, Adapter] = field(default_factory=dict)
    deleted_latest: dict[str, int] = field(default_factory=dict)
    requests: dict[str, RequestRecord] = field(default_factory=dict)
    # The quota of every adapter without its own (QUOTA_SET with no name).
    default_quota: Quota | None = None
    names: list[str] = field(default_factory=list, compare=False, repr=False)
    _encoded: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.names) != len(self.adapters):
            self.names = sorted(self.adapters)

    def next_revision(self, name: str) -> int:
        adapter = self.adapters.get(name)
        if adapter is not None:
            return adapter.latest_revision + 1
        return self.deleted_latest.get(name, 0) + 1

    def apply(self, change: Change) -> None:
        """Folds one change in; changes must come in seq order, each exactly once."""
        if change.seq != self.seq + 1:
            raise DataLoss(f"log entry {change.seq} applied out of order at seq {self.seq}")
        _FOLDS[change.type](self, change)
        self._encoded.pop(change.adapter_name, None)
        self.seq = change.seq
        self._remember_request(change)

    def _remember_request(self, change: Change) -> None:
        if change.request_key:
            # A key past the window may come again; re-adding keeps the seq order.
            self.requests.pop(change.request_key, None)
            self.requests[change.request_key] = RequestRecord(change.seq, change.request_digest)
        # Keys are added in seq order, so the oldest are first.
        while self.requests:
            oldest = next(iter(self.requests))
            if self.requests[oldest].seq > self.seq - REQUEST_KEY_WINDOW:
                break
            del self.requests[oldest]

    def copy(self) -> StoreState:
        """A copy later `apply` calls leave alone (rollouts and quotas are immutable)."""
        return StoreState(
            seq=self.seq,
            adapters={
                name: replace(a, revisions=dict(a.revisions)) for name, a in self.adapters.items()
            },
            deleted_latest=dict(self.deleted_latest),
            requests=dict(self.requests),
            default_quota=self.default_quota,
            names=list(self.names),
            _encoded=dict(self._encoded),
        )

    def encode(self, storage_format: int = OLDEST_FORMAT) -> bytes:
        """`to_json` as compact JSON bytes in `storage_format`, reusing the encoding of
        every adapter that no change touched since it was last encoded."""
        adapters = []
        for name in self.names:
            encoded = self._encoded.get(name)
            if encoded is None:
                encoded = _compact(self.adapters[name].to_json())
                self._encoded[name] = encoded
            adapters.append(encoded)
        rest = _compact(self._rest_json())
        fields: dict[str, Any] = {"format": storage_format, "seq": self.seq}
        if storage_format > OLDEST_FORMAT:
            fields["writer"] = RELEASE
        head = _compact(fields)
        return b"".join((head[:-1], b',"adapters":[', b",".join(adapters), b"],", rest[1:]))

    def _rest_json(self) -> dict[str, Any]:
        rest: dict[str, Any] = {
            "deleted_latest": dict(sorted(self.deleted_latest.items())),
            "requests": [{"key": k, **r.to_json()} for k, r in self.requests.items()],
        }
        if self.default_quota is not None:
            rest["default_quota"] = self.default_quota.to_json()
        return rest

    def to_json(self) -> dict[str, Any]:
        return {
            "format": OLDEST_FORMAT,
            "seq": self.seq,
            "adapters": [a.to_json() for _, a in sorted(self.adapters.items())],
            **self._rest_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StoreState:
        check_readable(data, "snapshot")
        adapters = [Adapter.from_json(a) for a in data["adapters"]]
        return cls(
            seq=int(data["seq"]),
            adapters={a.name: a for a in adapters},
            deleted_latest={str(k): int(v) for k, v in data["deleted_latest"].items()},
            requests={str(r["key"]): RequestRecord.from_json(r) for r in data.get("requests", [])},
            default_quota=Quota.from_json(data["default_quota"])
            if "default_quota" in data
            else None,
        )


def _compact(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _fold_push(state: StoreState, change: Change) -> None:
    name = change.adapter_name
    revision = require_revision(change)
    adapter = state.adapters.get(name)
    if adapter is None:
        adapter = Adapter(
            name=name,
            revisions={},
            current_revision=0,
            latest_revision=state.deleted_latest.pop(name, 0),
            create_time=change.time,
            update_time=change.time,
        )
        state.adapters[name] = adapter
        bisect.insort(state.names, name)
    if revision.revision <= adapter.latest_revision:
        raise DataLoss(f"log entry {change.seq} reuses revision {name}@{revision.revision}")
    adapter.revisions[revision.revision] = revision
    adapter.latest_revision = revision.revision
    adapter.current_revision = change.current_revision
    adapter.update_time = change.time


def _fold_rollout(state: StoreState, change: Change) -> None:
    """The rollout after the change replaces the adapter's; a promote also moves the
    current revision. A start needs no active rollout, any other change the active
    one it names (by its start seq): what the builders in rollout/changes.py check."""
    name = change.adapter_name
    adapter = state.adapters.get(name)
    rollout = change.record
    if adapter is None or not isinstance(rollout, Rollout):
        raise DataLoss(f"log entry {change.seq} changes a rollout of unknown adapter {name}")
    if rollout.candidate_revision not in adapter.revisions:
        raise DataLoss(
            f"log entry {change.seq} rolls out unknown {name}@{rollout.candidate_revision}"
        )
    active = adapter.active_rollout
    starts = rollout.start_seq == change.seq
    if (
        (active is not None)
        if starts
        else (active is None or active.start_seq != rollout.start_seq)
    ):
        raise DataLoss(f"log entry {change.seq} changes a rollout of {name} out of turn")
    adapter.rollout = rollout
    if rollout.state is RolloutState.PROMOTED:
        adapter.current_revision = rollout.candidate_revision
    adapter.update_time = change.time


def _fold_quota(state: StoreState, change: Change) -> None:
    """The quota after the change replaces the default (no name) or the adapter's."""
    record = change.record
    if not isinstance(record, QuotaChange):
        raise DataLoss(f"log entry {change.seq} sets a quota without one")
    if change.adapter_name == DEFAULT_QUOTA:
        state.default_quota = record.quota
        return
    adapter = state.adapters.get(change.adapter_name)
    if adapter is None:
        raise DataLoss(f"log entry {change.seq} sets a quota of unknown {change.adapter_name}")
    adapter.quota = record.quota


# How each kind of change folds into the state.
_FOLDS: dict[ChangeType, Callable[[StoreState, Change], None]] = {
    ChangeType.REVISION_PUSHED: _fold_push,
    ChangeType.CURRENT_REVISION_SET: fold_current_set,
    ChangeType.ADAPTER_DELETED: fold_delete,
    ChangeType.ROLLOUT_CHANGED: _fold_rollout,
    ChangeType.QUOTA_SET: _fold_quota,
    ChangeType.YANK_SET: fold_yank,
}
