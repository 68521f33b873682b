"""A rollout's figures from the counters replicas report, and the guards' verdict.

Replicas report cumulative counters per revision (requests, errors, tokens, TTFT
bucket counts), as Prometheus counters are. The store keeps the samples it read, per
replica, for the longest window it judges, and takes each arm's figures over a
window as the difference between the newest sample and the newest one at least a
window old (or the oldest it has, while it has watched for less than a window). A
replica that restarted (another counters epoch) or whose counts went down counts
from zero. Distinct callers are no count to difference: each replica reports its
most recent ones with the request count when each was last seen, so an arm's callers
in the window are those seen past the count at the window's start, merged across
replicas by their hash. Pure, no I/O: guard.py feeds it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from loraserve.adapterstore.replicas.model import ReplicaCounters
from loraserve.adapterstore.rollout.records import ArmFigures, Guards, Rollout
from loraserve.common.fleet.reports import RevisionCounters, RevisionReport

# Samples kept per replica, whatever the windows: a bound on memory.
_MAX_SAMPLES = 2048


@dataclass(frozen=True, slots=True)
class _Sample:
    time: float
    counters: ReplicaCounters

    def of(self, name: str, revision: int) -> RevisionCounters | None:
        return next(
            (c for c in self.counters.counters if (c.name, c.revision) == (name, revision)),
            None,
        )


@dataclass(frozen=True, slots=True)
class ArmDelta:
    """One arm's counts over a window on one replica."""

    requests: int = 0
    errors: int = 0
    generated_tokens: int = 0
    ttft_buckets: tuple[int, ...] = ()
    ttft_bounds: tuple[float, ...] = ()
    # Hashes of the callers seen in the window.
    callers: frozenset[int] = frozenset()


class CounterHistory:
    """The counter samples of each replica, oldest first."""

    def __init__(self) -> None:
        self._samples: dict[str, deque[_Sample]] = {}

    def record(self, time: float, reported: list[ReplicaCounters], keep_s: float) -> None:
        """Adds what each replica reported at `time` (a sample only when its counters
        object changed) and forgets samples older than `keep_s` but the newest of
        those, and replicas that reported nothing."""
        present = {c.replica_id for c in reported}
        for gone in set(self._samples) - present:
            del self._samples[gone]
        for counters in reported:
            samples = self._samples.setdefault(counters.replica_id, deque(maxlen=_MAX_SAMPLES))
            if not samples or samples[-1].counters != counters:
                samples.append(_Sample(time, counters))
            while len(samples) > 1 and samples[1].time <= time - keep_s:
                samples.popleft()

    def deltas(self, name: str, revision: int, window_s: float, now: float) -> dict[str, ArmDelta]:
        """Per replica, the revision's counts over the last `window_s`."""
        result = {}
        for replica, samples in self._samples.items():
            newest = samples[-1]
            latest = newest.of(name, revision)
            if latest is None:
                continue
            base = samples[0]
            for sample in samples:
                if sample.time > now - window_s:
                    break
                base = sample
            result[replica] = _delta(latest, newest, base.of(name, revision), base)
        return result


def _delta(
    latest: RevisionCounters,
    newest: _Sample,
    earlier: RevisionCounters | None,
    base: _Sample,
) -> ArmDelta:
    """The counts between `base` and `newest`: none from a single sample (what came
    before it is unknown), all of `latest` when the replica counts from zero since."""
    bounds = newest.counters.ttft_bounds
    if base is newest:
        return ArmDelta(ttft_buckets=(0,) * (len(bounds) + 1), ttft_bounds=bounds)
    if (
        earlier is None
        or base.counters.epoch != newest.counters.epoch
        or base.counters.ttft_bounds != bounds
        or earlier.requests > latest.requests
    ):
        return ArmDelta(
            latest.requests,
            latest.errors,
            latest.generated_tokens,
            latest.ttft_buckets,
            bounds,
            _callers_after(latest, 0),
        )
    return ArmDelta(
        latest.requests - earlier.requests,
        latest.errors - earlier.errors,
        latest.generated_tokens - earlier.generated_tokens,
        tuple(a - b for a, b in zip(latest.ttft_buckets, earlier.ttft_buckets, strict=True)),
        bounds,
        _callers_after(latest, earlier.requests),
    )


def _callers_after(latest: RevisionCounters, requests: int) -> frozenset[int]:
    """The callers last seen after the revision's `requests`-th request."""
    return frozenset(c.caller for c in latest.callers if c.last_request > requests)


def arm_figures(revision: int, deltas: list[ArmDelta]) -> ArmFigures:
    """One arm's figures, summed over replicas; TTFT from those with the same bounds
    as the first."""
    if not deltas:
        return ArmFigures(revision)
    bounds = deltas[0].ttft_bounds
    buckets = [0] * (len(bounds) + 1)
    for delta in deltas:
        if delta.ttft_bounds == bounds and len(delta.ttft_buckets) == len(buckets):
            buckets = [a + b for a, b in zip(buckets, delta.ttft_buckets, strict=True)]
    return ArmFigures(
        revision=revision,
        requests=sum(d.requests for d in deltas),
        errors=sum(d.errors for d in deltas),
        ttft_p95_s=quantile(0.95, bounds, buckets),
        generated_tokens=sum(d.generated_tokens for d in deltas),
        callers=len({caller for d in deltas for caller in d.callers}),
    )


def quantile(q: float, bounds: tuple[float, ...], cumulative: list[int]) -> float:
    """The q-quantile of a cumulative histogram (the last count is the total),
    interpolated linearly within its bucket as Prometheus' histogram_quantile does;
    the highest bound when it falls past it; 0 when empty."""
    total = cumulative[-1] if cumulative else 0
    if total <= 0 or not bounds:
        return 0.0
    rank = q * total
    for i, bound in enumerate(bounds):
        if cumulative[i] >= rank:
            below = cumulative[i - 1] if i else 0
            lower = bounds[i - 1] if i else 0.0
            inside = cumulative[i] - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
    return bounds[-1]


def verdict(
    rollout: Rollout,
    current: ArmFigures,
    candidate: ArmFigures,
    nacks: list[tuple[str, RevisionReport]],
) -> str:
    """Why the guards abort the rollout; "" while they do not. An arm is judged once it
    has `min_requests` requests from `min_callers` distinct callers in the window: the
    candidate for either margin, the current arm too for TTFT (as for requests)."""
    guards = rollout.guards
    if guards.abort_on_nack and nacks:
        return f"guard abort_on_nack: {refusals(rollout.adapter_name, nacks)}"
    window = f"over the last {guards.window_s:g} s"
    if not _judged(candidate, guards):
        return ""
    margin = guards.max_error_rate_margin
    if margin is not None and 100 * candidate.error_rate > 100 * current.error_rate + margin:
        return (
            f"guard max_error_rate_margin: the candidate's error rate "
            f"{_rate(candidate)} exceeds the current revision's {_rate(current)} by more "
            f"than {margin:g} percentage points {window}"
        )
    margin = guards.max_ttft_p95_margin
    if (
        margin is not None
        and _judged(current, guards)
        and candidate.ttft_p95_s > current.ttft_p95_s * (1 + margin / 100)
    ):
        return (
            f"guard max_ttft_p95_margin: the candidate's TTFT p95 "
            f"{1000 * candidate.ttft_p95_s:.0f} ms exceeds the current revision's "
            f"{1000 * current.ttft_p95_s:.0f} ms by more than {margin:g} % {window}"
        )
    return ""


def refusals(name: str, nacks: list[tuple[str, RevisionReport]]) -> str:
    """E.g. `replica r2 refused alpha@2: FAILED_PRECONDITION: rank 16 > 8`, `; ` apart."""
    return "; ".join(
        f"replica {replica} refused {name}@{report.revision}: "
        f"{_code_name(report)}{report.error.message if report.error else ''}"
        for replica, report in nacks
    )


def _judged(figures: ArmFigures, guards: Guards) -> bool:
    """Whether an arm's figures carry enough requests from enough callers to judge."""
    return figures.requests >= guards.min_requests and figures.callers >= guards.min_callers


def _rate(figures: ArmFigures) -> str:
    return (
        f"{100 * figures.error_rate:.1f} % ({figures.errors} of {figures.requests} requests "
        f"to @{figures.revision})"
    )


_CODE_NAMES = {
    1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND", 6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION", 10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED",
    13: "INTERNAL", 14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}  # fmt: skip


def _code_name(report: RevisionReport) -> str:
    if report.error is None:
        return ""
    return f"{_CODE_NAMES.get(report.error.code, str(report.error.code))}: "
