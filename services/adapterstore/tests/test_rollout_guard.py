"""The store's guards judge a rollout from the counters replicas report (issue 25,
item 4): figures over a window, the verdict, and the abort they write, on the
in-memory blob store."""

from __future__ import annotations

from datetime import UTC, datetime

from loraserve.adapterstore.replicas.model import ReplicaCounters, ReplicaReport
from loraserve.adapterstore.rollout.figures import CounterHistory, arm_figures, quantile, verdict
from loraserve.adapterstore.rollout.records import ArmFigures, Guards, Rollout, RolloutState
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.fleet.reports import (
    ReplicaError,
    RevisionCounters,
    RevisionReport,
    ServingState,
)
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push

BOUNDS = (0.1, 0.5, 1.0)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def counts(
    name: str, revision: int, requests: int, errors: int, epoch: str = "e1"
) -> ReplicaCounters:
    """A replica's counters with one revision: every request fast (under 0.1 s)."""
    return ReplicaCounters(
        "r1",
        epoch,
        BOUNDS,
        (RevisionCounters(name, revision, requests, errors, requests, (requests,) * 4),),
    )


def rollout(**guards: object) -> Rollout:
    return Rollout(
        "alpha", 2, 1, 20.0, RolloutState.ACTIVE, Guards(**guards),  # type: ignore[arg-type]
        3, 3, NOW, NOW, "ci", "ci",
    )  # fmt: skip


def test_quantile_interpolates_within_the_bucket_as_prometheus_does() -> None:
    # 10 requests: 5 under 0.1 s, 5 between 0.1 and 0.5 s -> p95 at 0.46 s.
    assert abs(quantile(0.95, BOUNDS, [5, 10, 10, 10]) - 0.46) < 1e-9
    assert quantile(0.95, BOUNDS, [0, 0, 0, 0]) == 0.0


def test_figures_are_the_difference_over_the_window() -> None:
    history = CounterHistory()
    history.record(0.0, [counts("alpha", 2, 10, 1)], keep_s=120)
    history.record(30.0, [counts("alpha", 2, 40, 4)], keep_s=120)
    history.record(70.0, [counts("alpha", 2, 100, 10)], keep_s=120)
    deltas = history.deltas("alpha", 2, window_s=60.0, now=70.0)
    assert (deltas["r1"].requests, deltas["r1"].errors) == (90, 9)


def test_a_replica_that_restarted_counts_from_zero() -> None:
    history = CounterHistory()
    history.record(0.0, [counts("alpha", 2, 500, 0)], keep_s=120)
    history.record(10.0, [counts("alpha", 2, 30, 3, epoch="e2")], keep_s=120)
    assert history.deltas("alpha", 2, 60.0, 10.0)["r1"].requests == 30


def test_error_rate_above_the_margin_condemns_the_candidate() -> None:
    current, candidate = ArmFigures(1, 200, 2), ArmFigures(2, 50, 10)
    reason = verdict(rollout(max_error_rate_margin=5.0), current, candidate, [])
    assert "error rate 20.0 % (10 of 50 requests to @2)" in reason
    assert "1.0 % (2 of 200 requests to @1)" in reason
    assert verdict(rollout(max_error_rate_margin=25.0), current, candidate, []) == ""


def test_too_few_candidate_requests_are_not_judged() -> None:
    reason = verdict(
        rollout(max_error_rate_margin=1.0, min_requests=20),
        ArmFigures(1, 100),
        ArmFigures(2, 5, 5),
        [],
    )
    assert reason == ""


def test_ttft_p95_above_the_margin_condemns_the_candidate() -> None:
    current = arm_figures(1, [])
    guards = {"max_ttft_p95_margin": 50.0, "min_requests": 1}
    slow = verdict(
        rollout(**guards), ArmFigures(1, 10, ttft_p95_s=0.1), ArmFigures(2, 10, ttft_p95_s=0.2), []
    )
    assert "TTFT p95 200 ms exceeds the current revision's 100 ms" in slow
    assert current.requests == 0


def test_a_nack_condemns_the_candidate_when_asked() -> None:
    nack = RevisionReport(2, ServingState.FAILED, ReplicaError(9, "rank 16 > 8"))
    reason = verdict(rollout(abort_on_nack=True), ArmFigures(1), ArmFigures(2), [("r2", nack)])
    assert (
        reason
        == "guard abort_on_nack: replica r2 refused alpha@2: FAILED_PRECONDITION: rank 16 > 8"
    )
    assert verdict(rollout(abort_on_nack=False), ArmFigures(1), ArmFigures(2), [("r2", nack)]) == ""


async def test_the_guard_aborts_a_rollout_whose_candidate_errs_and_says_why(
    memory_store: AdapterStore,
) -> None:
    await push(memory_store, "alpha", tiny_adapter(seed=1))
    await push(memory_store, "alpha", tiny_adapter(seed=2), no_promote=True)
    guards = Guards(abort_on_nack=False, max_error_rate_margin=10.0, min_requests=10)
    await memory_store.rollouts.start("alpha", 2, 50.0, guards, "ci")
    for step, (ok, bad) in enumerate(((0, 0), (100, 40))):
        report = ReplicaReport(
            "r1", 3, "", 60.0, (),
            ReplicaCounters(
                "r1", "e1", BOUNDS,
                (
                    RevisionCounters("alpha", 1, ok, 0, ok, (ok,) * 4),
                    RevisionCounters("alpha", 2, bad, bad // 2, bad, (bad,) * 4),
                ),
            ),
        )  # fmt: skip
        await memory_store.replicas.report(report)
        await memory_store._guard.check()
        assert (await memory_store.rollouts.get("alpha")).rollout.active is (step == 0)
    view = await memory_store.rollouts.get("alpha")
    assert view.rollout.state is RolloutState.ABORTED
    assert view.rollout.updated_by == "rollout-guard"
    assert "error rate 50.0 % (20 of 40 requests to @2)" in view.rollout.end_reason
    assert [f.requests for f in view.figures] == [100, 40]
