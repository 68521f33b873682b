"""Benchmark 22's figures from the answers: when every replica sends every request to
the revision a promote or an abort names, the split's share, the failures."""

from __future__ import annotations

import pytest

from bench.fleet.rollout_figures import Served, candidate_shares, covered, failures, time_to_all


def _after_change(late: dict[int, float]) -> list[Served]:
    """Three replicas, a request every 0.1 s from t=9 to t=12; the change at t=10;
    replica i serves revision 1 until late[i] seconds after it, then revision 2."""
    records = []
    for replica in range(3):
        for step in range(30):
            at = 9.0 + step / 10
            moved = at >= 10.0 + late.get(replica, 0.0)
            records.append(Served(replica, at, 2 if moved else 1))
    return records


def test_time_to_all_is_the_last_request_another_revision_served_after_the_change() -> None:
    seconds = time_to_all(_after_change({0: 0.0, 1: 0.3, 2: 0.55}), target=2, changed_at=10.0)
    assert seconds == pytest.approx(0.5)


def test_a_change_every_replica_applied_before_any_request_took_no_time() -> None:
    assert time_to_all(_after_change({}), target=2, changed_at=10.0) == 0.0


def test_a_failed_request_after_the_change_counts_as_not_moved() -> None:
    records = [*_after_change({}), Served(1, 10.75, 0, "UNAVAILABLE")]
    assert time_to_all(records, target=2, changed_at=10.0) == pytest.approx(0.75)
    assert failures(records) == 1


def test_a_replica_with_no_request_after_the_change_settled_has_no_figure() -> None:
    records = [r for r in _after_change({}) if r.replica != 2 or r.submitted < 10.0]
    with pytest.raises(ValueError, match=r"replicas \[2\]"):
        time_to_all(records, target=2, changed_at=10.0)
    assert not covered(records, replicas=3, since=10.0)


def test_each_replica_is_covered_after_its_own_last_late_request() -> None:
    """Replica 0 moved late; the others sent nothing after that moment but moved early."""
    records = [r for r in _after_change({0: 0.85}) if r.replica == 0 or r.submitted < 10.5]
    assert time_to_all(records, target=2, changed_at=10.0) == pytest.approx(0.8)


def test_the_candidate_share_is_taken_per_replica_over_the_window_and_skips_failures() -> None:
    records = [Served(0, 1.0 + i / 10, 2 if i % 5 == 0 else 1) for i in range(10)]
    records += [Served(1, 1.0, 2), Served(1, 1.1, 1), Served(1, 1.2, 0, "UNAVAILABLE")]
    records.append(Served(1, 5.0, 2))
    assert candidate_shares(records, candidate=2, start=1.0, end=2.0) == {0: 0.2, 1: 0.5}
