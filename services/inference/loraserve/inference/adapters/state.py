"""Each revision's state on this replica, and how ListAdapters shows it.

Pure data, no I/O. A revision the registry knows is one `RevisionEntry`, moved by
`AdapterRegistry` through

    (none) -> LOADING -> READY <-> DRAINING -> REMOVING -> (none)
                 |            (READY: current or pinned;
                 v             DRAINING: neither, requests still on it)
               FAILED -> LOADING (asked again) | (none) (deleted)

A routed revision that is not loaded has no entry: it is AVAILABLE. The story is in
docs/design.md ("Residency is a hierarchy", "Hot swap").
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.inference.adapters.tiers import Tier
from loraserve.inference.engine import AdapterHandle


class RevisionLife(enum.Enum):
    """Where a revision is in its life on this replica."""

    # Routed here but not loaded: its first request loads it.
    AVAILABLE = "available"
    # Being fetched, checked and added to the engine; nothing routes to it yet.
    LOADING = "loading"
    # In the engine and current or pinned: new requests may use it.
    READY = "ready"
    # In the engine, neither current nor pinned: only requests already on it.
    DRAINING = "draining"
    # Leaving the engine, then its files go back to the cache. Shown as DRAINING.
    REMOVING = "removing"
    # Its last load failed; nothing of it is in the engine or the cache.
    FAILED = "failed"


# The engine holds the revision (its `handle` is set) in exactly these states.
IN_ENGINE = frozenset({RevisionLife.READY, RevisionLife.DRAINING, RevisionLife.REMOVING})


@dataclass(frozen=True)
class RevisionStatus:
    """One revision as ListAdapters reports it."""

    name: str
    revision: int
    state: RevisionLife
    # Whether the name routes to this revision.
    current: bool
    # Requests running on it now.
    in_flight: int = 0
    # The engine's id for it; 0 when it is not in the engine.
    lora_int_id: int = 0
    rank: int = 0
    # Why its last load failed (FAILED only).
    last_error: str = ""
    tier: Tier = Tier.STORE
    # Whether it is the candidate of the name's rollout, which sends it
    # `rollout_weight` percent of the name's requests.
    candidate: bool = False
    rollout_weight: float = 0.0


@dataclass(eq=False)
class RevisionEntry:
    """Everything the registry knows of one revision.

    Invariants: `handle` is set exactly in IN_ENGINE states; READY means current or
    pinned (`pinned_at` > 0), DRAINING neither with `in_flight` > 0, and an idle
    revision that is neither leaves at once (REMOVING); `discarded` is only ever set
    in LOADING; `done` is set when a LOADING or REMOVING step ends, so waiters look
    again.
    """

    key: RevisionKey
    state: RevisionLife
    # None only while a pinned revision's manifest is being looked up.
    manifest: Revision | None = None
    path: Path | None = None
    handle: AdapterHandle | None = None
    in_flight: int = 0
    # Requests waiting for its load (or its removal) to end: they are about to run on
    # it, so it must not be evicted under them.
    waiters: int = 0
    # LRU stamp of the last pin; 0 when not pinned.
    pinned_at: int = 0
    # Monotonic time of the last pin: a pin used since `PinSettings.idle_s` keeps its place.
    pin_used_at: float = 0.0
    # The name was deleted while this loaded: the result is dropped.
    discarded: bool = False
    # The load had to download it (not found on the cache's disk).
    downloaded: bool = False
    error: str = ""
    # The google.rpc code of `error` (FAILED only).
    error_code: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The load, while LOADING; its callers wait on it.
    task: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return self.key.name

    @property
    def revision(self) -> int:
        return self.key.revision

    @property
    def rank(self) -> int:
        return self.manifest.rank if self.manifest is not None else 0

    @property
    def releasable(self) -> bool:
        """In the engine and needed by no request (running or about to), and not
        pinned; the caller decides about its route."""
        return (
            self.state is RevisionLife.READY
            and not self.in_flight
            and not self.waiters
            and not self.pinned_at
        )


def statuses(
    entries: Mapping[RevisionKey, RevisionEntry],
    routes: Mapping[str, int],
    targets: Mapping[str, Revision],
    splits: Mapping[str, tuple[Revision, float]],
    *,
    on_disk: Callable[[RevisionKey], bool],
    in_host_memory: Callable[[int], bool],
) -> list[RevisionStatus]:
    """Every revision known, loaded or only routed, ordered by name then revision,
    each in the tier its weights are: running requests (SLOT), in the engine's host
    memory (HOST), on disk only (DISK) or in the store only (STORE)."""

    def tier(entry: RevisionEntry) -> Tier:
        if entry.in_flight:
            return Tier.SLOT
        if entry.handle is not None and entry.state in IN_ENGINE:
            return Tier.HOST if in_host_memory(entry.handle.lora_int_id) else Tier.DISK
        return Tier.DISK if on_disk(entry.key) else Tier.STORE

    found = {key: _status(e, routes, tier(e)) for key, e in entries.items()}
    arms = {candidate.key: (candidate, weight) for candidate, weight in splits.values()}
    for target, current in [(t, True) for t in targets.values()] + [
        (candidate, False) for candidate, _ in arms.values()
    ]:
        if target.key not in found:
            found[target.key] = RevisionStatus(
                target.adapter_name,
                target.revision,
                RevisionLife.AVAILABLE,
                current=current,
                rank=target.rank,
                tier=Tier.DISK if on_disk(target.key) else Tier.STORE,
            )
    for key, (_, weight) in arms.items():
        found[key] = replace(found[key], candidate=True, rollout_weight=weight)
    return [found[key] for key in sorted(found)]


def _status(entry: RevisionEntry, routes: Mapping[str, int], tier: Tier) -> RevisionStatus:
    if entry.handle is None or entry.state not in IN_ENGINE:
        return RevisionStatus(
            entry.name,
            entry.revision,
            entry.state,
            current=False,
            rank=entry.rank,
            last_error=entry.error,
            tier=tier,
        )
    return RevisionStatus(
        entry.name,
        entry.revision,
        RevisionLife.READY if entry.state is RevisionLife.READY else RevisionLife.DRAINING,
        current=routes.get(entry.name) == entry.revision,
        in_flight=entry.in_flight,
        lora_int_id=entry.handle.lora_int_id,
        rank=entry.rank,
        tier=tier,
    )
