"""The store's guards judge a rollout from the counters replicas report (issue 25,
item 4): figures over a window, the verdict, and the abort they write, on the
in-memory blob store; and (issue 54, item 2) no verdict on fewer distinct callers
than the rollout's minimum, counted over the window and merged across replicas."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from loraserve.adapterstore.replicas.model import ReplicaCounters, ReplicaReport
from loraserve.adapterstore.rollout.figures import CounterHistory, arm_figures, quantile, verdict
from loraserve.adapterstore.rollout.records import ArmFigures, Guards, Rollout, RolloutState
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.config.textlimits import MAX_ROLLOUT_CALLERS
from loraserve.common.errors import InvalidArgument
from loraserve.common.fleet.reports import (
    CallerSighting,
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
    name: str,
    revision: int,
    requests: int,
    errors: int,
    epoch: str = "e1",
    callers: tuple[CallerSighting, ...] = (),
    replica: str = "r1",
) -> ReplicaCounters:
    """A replica's counters with one revision: every request fast (under 0.1 s)."""
    return ReplicaCounters(
        replica,
        epoch,
        BOUNDS,
        (RevisionCounters(name, revision, requests, errors, requests, (requests,) * 4, callers),),
    )


def sightings(*seen: tuple[int, int]) -> tuple[CallerSighting, ...]:
    """(caller, last_request) pairs, oldest first."""
    return tuple(CallerSighting(caller, last) for caller, last in seen)


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
    current, candidate = ArmFigures(1, 200, 2, callers=9), ArmFigures(2, 50, 10, callers=3)
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
        rollout(**guards),
        ArmFigures(1, 10, ttft_p95_s=0.1, callers=3),
        ArmFigures(2, 10, ttft_p95_s=0.2, callers=3),
        [],
    )
    assert "TTFT p95 200 ms exceeds the current revision's 100 ms" in slow
    assert current.requests == 0


def test_ttft_p95_within_the_margin_does_not_condemn_the_candidate() -> None:
    # 40 % slower than the current revision, under a margin of 50 %: judged (enough
    # requests and callers, as above) and let through.
    within = verdict(
        rollout(max_ttft_p95_margin=50.0, min_requests=1),
        ArmFigures(1, 10, ttft_p95_s=0.1, callers=3),
        ArmFigures(2, 10, ttft_p95_s=0.14, callers=3),
        [],
    )
    assert within == ""


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
                    RevisionCounters(
                        "alpha", 2, bad, bad // 2, bad, (bad,) * 4,
                        sightings(*((c, bad) for c in range(3 if bad else 0))),
                    ),
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


def test_an_arms_callers_are_those_seen_in_the_window_merged_across_replicas() -> None:
    history = CounterHistory()
    before = sightings((1, 5), (2, 10))
    history.record(
        0.0,
        [counts("alpha", 2, 10, 0, callers=before, replica=r) for r in ("r1", "r2")],
        keep_s=120,
    )
    # A window later: r1 saw caller 2 again (caller 1 last at its 5th request, before
    # the window); r2 saw callers 2 and 3. Two distinct callers in the window.
    history.record(
        70.0,
        [
            counts("alpha", 2, 20, 0, callers=sightings((1, 5), (2, 20))),
            counts("alpha", 2, 14, 0, callers=sightings((2, 12), (3, 14)), replica="r2"),
        ],
        keep_s=120,
    )
    deltas = history.deltas("alpha", 2, window_s=60.0, now=70.0)
    assert arm_figures(2, list(deltas.values())).callers == 2


def test_an_arm_with_fewer_callers_than_min_callers_is_not_judged() -> None:
    failing = rollout(max_error_rate_margin=1.0, min_requests=10, min_callers=3)
    current = ArmFigures(1, 100, 0, callers=50)
    assert verdict(failing, current, ArmFigures(2, 100, 90, callers=2), []) == ""
    assert "error rate" in verdict(failing, current, ArmFigures(2, 100, 90, callers=3), [])


async def test_the_guard_gives_no_verdict_on_one_callers_failing_requests(
    memory_store: AdapterStore,
) -> None:
    await push(memory_store, "alpha", tiny_adapter(seed=1))
    await push(memory_store, "alpha", tiny_adapter(seed=2), no_promote=True)
    guards = Guards(abort_on_nack=False, max_error_rate_margin=10.0, min_requests=10)
    await memory_store.rollouts.start("alpha", 2, 50.0, guards, "ci")
    for bad in (0, 40):
        # Every candidate request from one caller, half of them failing.
        one_caller = sightings((7, bad)) if bad else ()
        report = ReplicaReport(
            "r1", 3, "", 60.0, (),
            ReplicaCounters(
                "r1", "e1", BOUNDS,
                (RevisionCounters("alpha", 2, bad, bad // 2, bad, (bad,) * 4, one_caller),),
            ),
        )  # fmt: skip
        await memory_store.replicas.report(report)
        await memory_store._guard.check()
    view = await memory_store.rollouts.get("alpha")
    assert view.rollout.active
    assert (view.figures[1].requests, view.figures[1].callers) == (40, 1)


@pytest.mark.parametrize(
    "callers",
    [
        sightings(*((c, 20) for c in range(MAX_ROLLOUT_CALLERS + 1))),
        sightings((1, 21)),
        sightings((1, 0)),
        sightings((1, 5), (1, 6)),
    ],
    ids=["too-many", "past-requests", "at-zero", "repeated"],
)
async def test_a_report_of_callers_the_counts_cannot_hold_is_invalid(
    memory_store: AdapterStore, callers: tuple[CallerSighting, ...]
) -> None:
    report = ReplicaReport("r1", 0, "", 60.0, (), counts("alpha", 2, 20, 0, callers=callers))
    with pytest.raises(InvalidArgument, match="counters of alpha@2: callers must be"):
        await memory_store.replicas.report(report)


async def test_a_min_callers_replicas_could_never_report_is_invalid(
    memory_store: AdapterStore,
) -> None:
    await push(memory_store, "alpha", tiny_adapter(seed=1))
    await push(memory_store, "alpha", tiny_adapter(seed=2), no_promote=True)
    too_many = Guards(min_callers=MAX_ROLLOUT_CALLERS + 1)
    with pytest.raises(InvalidArgument, match=r"guards\.min_callers must be from 1 to 16"):
        await memory_store.rollouts.start("alpha", 2, 20.0, too_many, "ci")
