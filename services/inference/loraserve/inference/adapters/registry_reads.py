"""Reading what the registry holds: where names route, which revisions are loaded,
the counts, ListAdapters' snapshot and the store's reports. Only reads: every change
is `AdapterRegistry`'s (registry.py), which these methods are part of."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loraserve.clients.store import RolloutSplit
from loraserve.common.fleet.reports import AdapterReport
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.inference.adapters.arms import CandidateArms
from loraserve.inference.adapters.ports import RevisionCache
from loraserve.inference.adapters.reporting import adapter_report
from loraserve.inference.adapters.state import (
    IN_ENGINE,
    RevisionEntry,
    RevisionLife,
    RevisionStatus,
    statuses,
)


@dataclass(frozen=True)
class RegistryCounts:
    """How many of each the registry has now."""

    # Names routed here, loaded or not.
    routed: int
    # Names routed to a revision in the engine or loading one.
    resident: int
    # Revisions in the engine (READY, DRAINING or leaving).
    loaded: int
    # Revisions running requests: each takes a LoRA slot while batched.
    in_slots: int


class RegistryReads:
    """The registry's state and what is read of it."""

    _entries: dict[RevisionKey, RevisionEntry]
    _routes: dict[str, int]
    _targets: dict[str, Revision]
    _arms: CandidateArms
    _cache: RevisionCache

    def report(self, name: str) -> AdapterReport | None:
        """What the store should know of the name here; None when nothing."""
        return adapter_report(name, self._entries, self._routes, self._targets, self._arms.splits)

    def split_of(self, name: str) -> RolloutSplit | None:
        """The name's active rollout here, if any."""
        return self._arms.splits.get(name)

    def names(self) -> set[str]:
        """Every name this registry holds anything of."""
        entries = {key.name for key in self._entries}
        return entries | self._routes.keys() | self._targets.keys() | set(self._arms.splits.names())

    def current_revision(self, name: str) -> int | None:
        """The revision `name` routes to in the engine; None when not loaded."""
        return self._routes.get(name)

    def held(self) -> dict[str, int]:
        """Every name held here (routed, targeted, loaded, loading or pinned), with the
        lowest store seq among the manifests of its revisions held: one committed
        before the name's `create_seq` belongs to a deleted generation."""
        oldest: dict[str, int] = {}
        manifests = [e.manifest for e in self._entries.values()] + list(self._targets.values())
        for manifest in manifests:
            if manifest is not None:
                name = manifest.adapter_name
                oldest[name] = min(oldest.get(name, manifest.seq), manifest.seq)
        return oldest

    def target_revision(self, name: str) -> int | None:
        """The revision `name` should route to, loaded or not."""
        target = self._targets.get(name)
        return target.revision if target is not None else None

    def is_loaded(self, name: str, revision: int) -> bool:
        """Whether the revision is in the engine and may take requests (READY or
        DRAINING)."""
        entry = self._entries.get(RevisionKey(name, revision))
        return entry is not None and entry.state in (RevisionLife.READY, RevisionLife.DRAINING)

    def uses_files(self, name: str, revision: int) -> bool:
        """Whether the revision's files are in use: loaded, loading or leaving."""
        entry = self._entries.get(RevisionKey(name, revision))
        return entry is not None and entry.state is not RevisionLife.FAILED

    def is_resident(self, name: str) -> bool:
        """Whether `name` routes to a revision in the engine or one is loading for it."""
        return name in self._routes or any(
            e.name == name and e.state is RevisionLife.LOADING for e in self._entries.values()
        )

    def resident_names(self) -> list[str]:
        """The names that route to a revision in the engine, sorted."""
        return sorted(self._routes)

    def counts(self) -> RegistryCounts:
        entries = self._entries.values()
        return RegistryCounts(
            routed=len(self._targets),
            resident=len(self._routes),
            loaded=sum(1 for e in entries if e.state in IN_ENGINE),
            in_slots=sum(1 for e in entries if e.in_flight),
        )

    def snapshot(self, in_host_memory: Callable[[int], bool] | None = None) -> list[RevisionStatus]:
        """Every revision this registry knows, loaded or only routed, ordered by name
        then revision, each with the tier it is in; `in_host_memory` tells the
        lora_int_ids the engine holds in host memory (else all loaded ones count)."""
        splits = self._arms.splits
        return statuses(
            self._entries,
            self._routes,
            self._targets,
            {n: (s.candidate, s.weight) for n in splits.names() if (s := splits.get(n))},
            on_disk=lambda key: self._cache.is_cached(*key),
            in_host_memory=in_host_memory or (lambda lora_int_id: True),
        )
