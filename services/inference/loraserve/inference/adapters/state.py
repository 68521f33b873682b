"""One revision's state in the registry, and how ListAdapters reports it.

Pure data, no I/O: `AdapterRegistry` moves each `RevisionEntry` through its phases

    (none) -> LOADING -> READY <-> DRAINING -> REMOVING -> (none)
                 |            (READY: current or pinned;
                 v             DRAINING: neither, requests still on it)
               FAILED -> LOADING (asked again) | (none) (deleted)

and `status_of` shows an entry as the public `AdapterState`, where REMOVING is
still DRAINING (the engine holds it until the removal ends).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loraserve.common.manifest import Revision
from loraserve.inference.engine import AdapterHandle

Key = tuple[str, int]


class AdapterState(enum.Enum):
    """A revision's state as ListAdapters reports it."""

    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"
    # Routed here but not loaded: its first request loads it.
    AVAILABLE = "available"


class Tier(enum.Enum):
    """Where a revision's weights are, nearest first: in a batch now, in the engine's
    host memory, on this replica's disk, or only in the store."""

    SLOT = "slot"
    HOST = "host"
    DISK = "disk"
    STORE = "store"


@dataclass(frozen=True)
class RevisionStatus:
    """One revision as ListAdapters reports it."""

    name: str
    revision: int
    state: AdapterState
    current: bool
    in_flight: int = 0
    lora_int_id: int = 0
    rank: int = 0
    last_error: str = ""
    tier: Tier = Tier.STORE


class Phase(enum.Enum):
    """Where a revision is in its life in the registry; see the diagram above."""

    LOADING = "loading"  # fetched, checked, added to the engine; nothing routes to it yet
    READY = "ready"  # in the engine and current or pinned: new requests may use it
    DRAINING = "draining"  # in the engine, neither: only requests already on it
    REMOVING = "removing"  # leaving the engine, then its files go back to the cache
    FAILED = "failed"  # its last load failed; nothing of it in the engine or the cache


@dataclass(eq=False)
class RevisionEntry:
    """Everything this registry knows of one revision.

    Invariants: `handle` is set exactly in READY, DRAINING and REMOVING (the engine
    holds it); READY means current or pinned (`pinned_at` > 0), DRAINING neither
    with `in_flight` > 0, and an idle revision that is neither leaves at once
    (REMOVING); `discarded` is only ever set in LOADING; `done` is set when a
    LOADING or REMOVING step ends, so waiters look again.
    """

    name: str
    revision: int
    phase: Phase
    # None only while a pinned revision's manifest is being looked up.
    manifest: Revision | None = None
    path: Path | None = None
    handle: AdapterHandle | None = None
    in_flight: int = 0
    # LRU stamp of the last pin; 0 when not pinned.
    pinned_at: int = 0
    # The name was deleted while this loaded: the result is dropped.
    discarded: bool = False
    # The load had to download it (not found on the cache's disk).
    downloaded: bool = False
    error: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The load, while LOADING; its callers wait on it.
    task: asyncio.Task[None] | None = None

    @property
    def key(self) -> Key:
        return (self.name, self.revision)

    @property
    def rank(self) -> int:
        return self.manifest.rank if self.manifest is not None else 0


IN_ENGINE = (Phase.READY, Phase.DRAINING, Phase.REMOVING)


def status_of(entry: RevisionEntry, routes: dict[str, int], tier: Tier) -> RevisionStatus:
    if entry.phase is Phase.LOADING:
        return RevisionStatus(
            entry.name,
            entry.revision,
            AdapterState.LOADING,
            current=False,
            rank=entry.rank,
            tier=tier,
        )
    if entry.phase is Phase.FAILED:
        return RevisionStatus(
            entry.name,
            entry.revision,
            AdapterState.FAILED,
            current=False,
            rank=entry.rank,
            last_error=entry.error,
            tier=tier,
        )
    assert entry.handle is not None
    return RevisionStatus(
        entry.name,
        entry.revision,
        AdapterState.READY if entry.phase is Phase.READY else AdapterState.DRAINING,
        current=routes.get(entry.name) == entry.revision,
        in_flight=entry.in_flight,
        lora_int_id=entry.handle.lora_int_id,
        rank=entry.rank,
        tier=tier,
    )


def statuses(
    entries: dict[Key, RevisionEntry],
    routes: dict[str, int],
    targets: dict[str, Revision],
    *,
    on_disk: Callable[[str, int], bool],
    in_host_memory: Callable[[int], bool],
) -> list[RevisionStatus]:
    """Every revision known, loaded or only targeted, ordered by name then revision,
    each in the tier its weights are: running requests (SLOT), loaded and in the
    engine's host memory (HOST), on disk only (DISK) or in the store only (STORE)."""

    def tier(entry: RevisionEntry) -> Tier:
        if entry.in_flight:
            return Tier.SLOT
        if entry.handle is not None and entry.phase in IN_ENGINE:
            return Tier.HOST if in_host_memory(entry.handle.lora_int_id) else Tier.DISK
        return Tier.DISK if on_disk(*entry.key) else Tier.STORE

    found = {key: status_of(e, routes, tier(e)) for key, e in entries.items()}
    for name, target in targets.items():
        key = (name, target.revision)
        if key not in found:
            found[key] = target_status(target, Tier.DISK if on_disk(*key) else Tier.STORE)
    return [found[key] for key in sorted(found)]


def target_status(target: Revision, tier: Tier) -> RevisionStatus:
    """A routed revision that is not loaded (`tier` is DISK or STORE)."""
    return RevisionStatus(
        target.adapter_name,
        target.revision,
        AdapterState.AVAILABLE,
        current=True,
        rank=target.rank,
        tier=tier,
    )
