"""What the store client hands its callers: listings, events and heartbeats as
frozen dataclasses, and their conversions from the store's protos.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.quota import Quota, quota_from_proto
from loraserve.common.revisions.manifest import Revision, revision_from_proto
from loraserve.common.tracing import bounded_traceparent


@dataclass(frozen=True, slots=True)
class RolloutSplit:
    """An active rollout: `weight` percent of the adapter's requests go to `candidate`.
    `start_seq` names the rollout."""

    candidate: Revision
    weight: float
    start_seq: int


@dataclass(frozen=True, slots=True)
class Yank:
    """A yanked revision and why: replicas refuse its pins."""

    revision: int
    reason: str


@dataclass(frozen=True, slots=True)
class ListedAdapter:
    """An adapter and its current revision (None while no revision is current).
    `create_seq` is its incarnation: a revision committed before it belongs to an
    earlier generation of the name, deleted since (0 from a store that does not say).
    `rollout` is its active rollout, if any; `quota` its own quota, if any; `yanks` its
    yanked revisions."""

    name: str
    current: Revision | None
    create_seq: int = 0
    rollout: RolloutSplit | None = None
    quota: Quota | None = None
    yanks: tuple[Yank, ...] = ()


@dataclass(frozen=True, slots=True)
class Listing:
    """Every adapter of the store, as of `seq` of the store's `incarnation` ("" from
    a store that does not say)."""

    adapters: tuple[ListedAdapter, ...]
    seq: int
    incarnation: str = ""
    # The quota of every adapter without its own (the first page's), if any.
    default_quota: Quota | None = None


class EventKind(enum.Enum):
    REVISION_PUSHED = pb.EVENT_TYPE_REVISION_PUSHED
    CURRENT_REVISION_SET = pb.EVENT_TYPE_CURRENT_REVISION_SET
    ADAPTER_DELETED = pb.EVENT_TYPE_ADAPTER_DELETED
    ROLLOUT_CHANGED = pb.EVENT_TYPE_ROLLOUT_CHANGED
    QUOTA_CHANGED = pb.EVENT_TYPE_QUOTA_CHANGED
    YANK_CHANGED = pb.EVENT_TYPE_YANK_CHANGED


@dataclass(frozen=True, slots=True)
class StoreEvent:
    """One committed change. `revision` is unset on delete; `current_revision` is
    the adapter's current revision after the change (0 after a delete). A
    ROLLOUT_CHANGED event's `rollout` is the split after it, None once it ended. A
    QUOTA_CHANGED event's `quota` is the quota of `name` ("": the default) after it,
    None once cleared. A YANK_CHANGED event's `yank` is the yank of `revision` after
    it, None once unyanked. `trace_parent` is the W3C traceparent of the request that
    made the change (a push's span; "" when untraced or over its bound), for the
    replica's work on the event to continue that trace."""

    seq: int
    kind: EventKind
    name: str
    revision: Revision | None
    current_revision: int
    rollout: RolloutSplit | None = None
    quota: Quota | None = None
    yank: Yank | None = None
    trace_parent: str = ""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The stream is alive; the store (of `incarnation`) has committed up to `seq`,
    as confirmed against object storage `stale_s` seconds before the heartbeat was
    sent."""

    seq: int
    stale_s: float = 0.0
    incarnation: str = ""


def heartbeat_from_proto(heartbeat: pb.Heartbeat) -> Heartbeat:
    # Both times come from the store's clock, so clock skew between hosts cannot
    # make a store look stale. A store without `synced_time` says nothing of it.
    if not heartbeat.HasField("synced_time"):
        return Heartbeat(heartbeat.seq, incarnation=heartbeat.incarnation)
    stale = heartbeat.time.ToDatetime() - heartbeat.synced_time.ToDatetime()
    return Heartbeat(heartbeat.seq, max(0.0, stale.total_seconds()), heartbeat.incarnation)


def event_from_proto(event: pb.AdapterEvent) -> StoreEvent:
    return StoreEvent(
        seq=event.seq,
        kind=EventKind(event.type),
        name=event.adapter_name,
        revision=revision_from_proto(event.revision) if event.HasField("revision") else None,
        current_revision=event.current_revision,
        rollout=split_from_proto(event.rollout) if event.HasField("rollout") else None,
        quota=quota_from_proto(event.quota) if event.HasField("quota") else None,
        yank=Yank(event.yank.revision, event.yank.reason) if event.HasField("yank") else None,
        trace_parent=bounded_traceparent(event.trace_parent),
    )


def listed_adapter_from_proto(adapter: pb.Adapter) -> ListedAdapter:
    return ListedAdapter(
        adapter.name,
        revision_from_proto(adapter.current) if adapter.current_revision else None,
        adapter.create_seq,
        split_from_proto(adapter.rollout) if adapter.HasField("rollout") else None,
        quota_from_proto(adapter.quota) if adapter.HasField("quota") else None,
        tuple(Yank(y.revision, y.reason) for y in adapter.yanked_revisions),
    )


def listing_from_proto(first: pb.ListAdaptersResponse, adapters: list[ListedAdapter]) -> Listing:
    """The listing of `adapters`, at the first page's seq and default quota."""
    default = first.default_quota if first.HasField("default_quota") else None
    return Listing(
        tuple(adapters),
        first.seq,
        first.incarnation,
        quota_from_proto(default) if default is not None else None,
    )


def split_from_proto(rollout: pb.Rollout) -> RolloutSplit | None:
    """The split an active rollout asks for; None for one that has ended."""
    if rollout.state != pb.ROLLOUT_STATE_ACTIVE:
        return None
    return RolloutSplit(revision_from_proto(rollout.candidate), rollout.weight, rollout.start_seq)
