"""Benchmark 22's figures, from the requests themselves: each answer names the revision
that served it, so when every replica sends every request to one revision is read off
the answers, not off what the replicas say of themselves."""

from __future__ import annotations

import math
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
    any replica went to `target`: per replica, the last request sent after `changed_at`
    that another revision served (or that failed), relative to `changed_at` (0 when there
    was none); the slowest replica's. Raises ValueError when a replica served no request
    by `target` sent after its last other one (the load did not cover the change there,
    so its figure would say nothing)."""
    seconds: dict[int, float] = {}
    for replica in sorted({r.replica for r in records}):
        after = [r for r in records if r.replica == replica and r.submitted >= changed_at]
        late = max([0.0, *(r.submitted - changed_at for r in after if r.revision != target)])
        if any(r.revision == target and r.submitted - changed_at >= late for r in after):
            seconds[replica] = late
        else:
            seconds[replica] = math.nan
    missing = [replica for replica, value in seconds.items() if math.isnan(value)]
    if missing:
        raise ValueError(
            f"replicas {missing} served no request by @{target} sent after their last "
            f"other one (per replica, s after the change: {seconds})"
        )
    return max(seconds.values(), default=0.0)


def covered(records: Sequence[Served], replicas: int, since: float) -> bool:
    """Whether every replica has finished a request sent at `since` or later."""
    return len({r.replica for r in records if r.submitted >= since}) == replicas


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
