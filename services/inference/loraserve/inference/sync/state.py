"""All of sync's bookkeeping: what the store wants this replica to serve (its current
revision and, during a rollout, the split with its candidate) and what came of
each load.

Pure, no I/O: the synchronizer's watch loop records what the store says here, one
worker per adapter reads the latest wish and applies it (`apply`), and what the
registry then holds is reported by `reports`. Events that pile up for one adapter fold
into one wish, so a burst of pushes loads only the revision that ends up current.
The applied seq is the highest seq below which every event has been applied (or
rejected for good).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loraserve.clients.store import EventKind, Listing, RolloutSplit, StoreEvent
from loraserve.common.revisions.manifest import Revision, RevisionKey


@dataclass
class AdapterWish:
    """The store's latest wish for one adapter, and the events it still stands for."""

    # Revision to route the name to; None when the store names no current revision.
    current: Revision | None = None
    # Monotonic time the event asking for `current` was received, for the swap
    # latency; None when it came from the start-up listing, which is no swap.
    current_seen_at: float | None = None
    # Non-current revisions pushed since; loaded ahead so promoting them is quick.
    preload: dict[int, Revision] = field(default_factory=dict)
    # Seq of a delete not applied yet; 0 for none. Applied before anything else, so
    # a name deleted and pushed again drops the old revisions.
    delete_seq: int = 0
    # The active rollout's split; None while the adapter has none.
    rollout: RolloutSplit | None = None
    # Seqs of received events not yet applied.
    pending_seqs: list[int] = field(default_factory=list)
    # Bumped on every change, so a worker knows whether it applied the latest wish.
    version: int = 0
    # The W3C traceparent the latest event carried (its push's, say), so applying the
    # wish continues that trace; "" after a listing or an untraced change.
    trace_parent: str = ""
    # Monotonic time that event arrived, for the span of its wait for a worker; None
    # once an attempt to apply it has started (a retry waits for nothing new).
    received_at: float | None = None


class SyncState:
    """Wishes per adapter, the seqs received and applied, the outcome of loads."""

    def __init__(self) -> None:
        self.wishes: dict[str, AdapterWish] = {}
        # Last event seq taken in (or the listing's seq): where a watch resumes.
        self.received_seq = 0
        # Revisions rejected for good: not tried again until an event asks for them.
        self.rejected: set[RevisionKey] = set()
        # Non-current revisions already loaded (or rejected) once.
        self.preloaded: set[RevisionKey] = set()
        # Names some revision of which was served since their last delete.
        self.served: set[str] = set()
        # The store incarnation `received_seq` counts in; None before the first
        # listing, "" from a store that names none.
        self.incarnation: str | None = None

    def applied_seq(self) -> int:
        pending = [min(w.pending_seqs) for w in self.wishes.values() if w.pending_seqs]
        return min(pending) - 1 if pending else self.received_seq

    def is_replay(self, event: StoreEvent) -> bool:
        return event.seq <= self.received_seq

    def is_gap(self, event: StoreEvent) -> bool:
        """Whether events were skipped: the store's log has no holes, so a jump
        means this replica missed changes and must list again."""
        return event.seq > self.received_seq + 1

    def record_event(self, event: StoreEvent, seen_at: float) -> AdapterWish:
        wish = self.wishes.setdefault(event.name, AdapterWish())
        revision = event.revision
        if revision is not None:
            # Asked for again: a revision rejected before gets one more try.
            self.rejected.discard(revision.key)
        if event.kind is EventKind.ROLLOUT_CHANGED:
            wish.rollout = event.rollout
        if event.kind is EventKind.ADAPTER_DELETED:
            wish.current = None
            wish.rollout = None
            wish.preload.clear()
            wish.delete_seq = event.seq
        elif revision is not None and event.current_revision == revision.revision:
            wish.current = revision
            wish.current_seen_at = seen_at
            wish.preload.pop(revision.revision, None)
        elif revision is not None and event.kind is EventKind.REVISION_PUSHED:
            wish.preload[revision.revision] = revision
        wish.pending_seqs.append(event.seq)
        wish.version += 1
        wish.trace_parent, wish.received_at = event.trace_parent, seen_at
        self.received_seq = event.seq
        return wish

    def record_listing(
        self,
        listing: Listing,
        served_names: set[str],
        seen_at: float | None,
        forget: frozenset[str] = frozenset(),
    ) -> list[str]:
        """Makes the listing the wish: its current revision for every adapter that
        has one, a delete for every served name that has none (not listed, or listed
        without a current revision, e.g. deleted and pushed again unpromoted). The
        names to `forget` get a delete first even when listed (see generations.py).
        Returns the adapters whose wish changed."""
        changed = []
        listed = {a.name: a.current for a in listing.adapters if a.current is not None}
        rollouts = {a.name: a.rollout for a in listing.adapters}
        for name, current in listed.items():
            wish = self.wishes.setdefault(name, AdapterWish())
            wish.rollout = rollouts.get(name)
            if name in forget:
                wish.delete_seq = listing.seq
                wish.preload.clear()
                wish.current = None
            if wish.current is None or wish.current.revision != current.revision:
                wish.current_seen_at = seen_at
            wish.current = current
            wish.pending_seqs.append(listing.seq)
            wish.version += 1
            wish.trace_parent, wish.received_at = "", None
            changed.append(name)
        wished = {n for n, w in self.wishes.items() if w.current is not None or w.preload}
        for name in sorted((served_names | wished | forget) - listed.keys()):
            self._wish_deleted(name, listing.seq)
            changed.append(name)
        self.received_seq = listing.seq
        self.incarnation = listing.incarnation
        return changed

    def _wish_deleted(self, name: str, seq: int) -> None:
        wish = self.wishes.setdefault(name, AdapterWish())
        wish.current = None
        wish.rollout = None
        wish.preload.clear()
        wish.delete_seq = seq
        wish.pending_seqs.append(seq)
        wish.version += 1
        wish.trace_parent, wish.received_at = "", None

    def mark_applied(self, name: str, version: int) -> bool:
        """Marks an adapter's wish at `version` applied; False if a newer one came."""
        wish = self.wishes[name]
        if wish.version != version:
            return False
        wish.pending_seqs.clear()
        if wish.current is None and not wish.preload and not wish.delete_seq and not wish.rollout:
            del self.wishes[name]
        return True

    def forget(self, name: str) -> None:
        """The adapter was deleted: what came of its loads no longer matters."""
        self.served.discard(name)
        self.rejected = {key for key in self.rejected if key[0] != name}
        self.preloaded = {key for key in self.preloaded if key[0] != name}
