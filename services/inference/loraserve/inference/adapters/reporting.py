"""What this replica tells the store of one adapter: the revision its requests go
to, and every revision it routes or refused, each with its state (an
`AdapterReport`, as the store keeps it). Pure: read from the registry's maps."""

from __future__ import annotations

from collections.abc import Mapping

from loraserve.common.fleet.reports import (
    AdapterReport,
    ReplicaError,
    RevisionReport,
    ServingState,
)
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.inference.adapters.rollouts import Splits
from loraserve.inference.adapters.state import IN_ENGINE, RevisionEntry, RevisionLife

# The store keeps at most this many revisions per adapter and replica.
MAX_REPORTED_REVISIONS = 4


def adapter_report(
    name: str,
    entries: Mapping[RevisionKey, RevisionEntry],
    routes: Mapping[str, int],
    targets: Mapping[str, Revision],
    splits: Splits,
) -> AdapterReport | None:
    """The name's report; None when this replica holds nothing of it to report."""
    serving = routes.get(name, 0)
    target = targets.get(name)
    split = splits.get(name)
    wanted = {serving} if serving else set()
    if target is not None:
        wanted.add(target.revision)
    candidate = split.candidate.revision if split is not None else 0
    if candidate:
        wanted.add(candidate)
    floor = min(wanted, default=0)
    failed = {
        e.revision for e in entries.values() if e.name == name and e.state is RevisionLife.FAILED
    }
    numbers = wanted | {r for r in failed if r >= floor}
    if not numbers:
        return None
    if not serving and target is not None and target.revision not in failed:
        serving = target.revision
    revisions = [
        _revision(entries.get(RevisionKey(name, n)), n, routes.get(name), n == candidate)
        for n in sorted(numbers, reverse=True)[:MAX_REPORTED_REVISIONS]
    ]
    return AdapterReport(name, serving, tuple(sorted(revisions, key=lambda r: r.revision)))


def _revision(
    entry: RevisionEntry | None, number: int, route: int | None, candidate: bool
) -> RevisionReport:
    """A revision on its way in (loading, or waiting to retry a load that failed
    for now) while its name routes to another one is not routed yet
    (make-before-break); one loading for the requests that wait on it is."""
    if entry is not None and entry.state is RevisionLife.FAILED:
        error = ReplicaError(entry.error_code, entry.error)
        return RevisionReport(number, ServingState.FAILED, error, candidate)
    pending = entry is None or entry.state is RevisionLife.LOADING
    if pending and route not in (None, number) and not candidate:
        return RevisionReport(number, ServingState.LOADING, candidate=candidate)
    if entry is not None and entry.state in IN_ENGINE and entry.state is not RevisionLife.REMOVING:
        return RevisionReport(number, ServingState.LOADED, candidate=candidate)
    return RevisionReport(number, ServingState.ROUTED, candidate=candidate)
