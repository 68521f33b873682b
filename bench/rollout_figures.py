"""Benchmark 19's figures, from the requests themselves: each answer names the revision
that served it, so when every replica sends every request to one revision is read off
the answers, not off what the replicas say of themselves."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Served:
    """One request of the load: where it went, when it was sent, what served it."""

    replica: int
    submitted: float
    # The revision its answer named; 0 when it failed.
    revision: int
    # The gRPC status code's name when it failed, else "".
    error: str = ""


def time_to_all(records: Sequence[Served], target: int, changed_at: float) -> float:
    """Seconds from `changed_at` (a promote or an abort sent) until every request sent to
    any replica went to `target`: the last request sent after `changed_at` that another
    revision served (or that failed), relative to `changed_at`; 0 when there was none.
    Raises ValueError when some replica served no request after that moment (the load
    did not cover the change there, so the figure would say nothing)."""
    after = [r for r in records if r.submitted >= changed_at]
    late = [r.submitted - changed_at for r in after if r.revision != target]
    seconds = max([0.0, *late])
    replicas = {r.replica for r in records}
    covered = {
        r.replica for r in after if r.revision == target and r.submitted >= changed_at + seconds
    }
    if covered != replicas:
        missing = sorted(replicas - covered)
        raise ValueError(f"replicas {missing} served no request after the change settled")
    return seconds


def candidate_shares(
    records: Sequence[Served], candidate: int, start: float, end: float
) -> dict[int, float]:
    """Per replica, the share of the requests sent in [start, end) that the candidate
    served (a steady split's share)."""
    shares: dict[int, float] = {}
    for replica in sorted({r.replica for r in records}):
        window = [r for r in records if r.replica == replica and start <= r.submitted < end]
        served = [r for r in window if not r.error]
        if served:
            shares[replica] = sum(r.revision == candidate for r in served) / len(served)
    return shares


def failures(records: Sequence[Served]) -> int:
    return sum(bool(r.error) for r in records)
