"""Where an adapter has run since a round, from two readings of the replicas' rates."""

from __future__ import annotations

import math

from loraserve.clients.balancing.recent import RATE_TIME_CONSTANT_S, Reading, RecentAdmissions

UP = {"r1", "r2"}


def _reading(
    at: float, rates: dict[str, float], processes: dict[str, str] | None = None
) -> Reading:
    """Rates of "alpha" on each replica up (`processes`: which answered at each)."""
    processes = processes or {r: f"{r}-process" for r in UP}
    return Reading(
        {("alpha", r): rate for r, rate in rates.items()}, dict.fromkeys(processes, at), processes
    )


def _decayed(rate: float, seconds: float) -> float:
    return rate * math.exp(-seconds / RATE_TIME_CONSTANT_S)


def test_admissions_before_a_round_do_not_count_since_it() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {"r1": 1.0}))
    # r1's rate only decays; r2 admitted two requests or so meanwhile.
    recent.record(2, _reading(102.0, {"r1": _decayed(1.0, 2), "r2": 0.3}))
    assert recent.runs_mostly({"alpha": 1}, UP) == {"alpha": "r2"}


def test_all_the_rates_remember_count_for_an_adapter_not_placed_yet() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {"r1": 1.0}))
    recent.record(2, _reading(102.0, {"r1": _decayed(1.0, 2), "r2": 0.3}))
    assert recent.runs_mostly({"alpha": None}, UP) == {"alpha": "r1"}


def test_one_admission_since_a_round_says_nothing() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {}))
    recent.record(2, _reading(102.0, {"r2": 1 / RATE_TIME_CONSTANT_S}))
    assert recent.runs_mostly({"alpha": 1}, UP) == {}


def test_admissions_split_evenly_run_mostly_nowhere() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {}))
    recent.record(2, _reading(102.0, {"r1": 0.5, "r2": 0.5}))
    assert recent.runs_mostly({"alpha": 1}, UP) == {}


def test_a_replica_down_is_not_followed() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {}))
    recent.record(2, _reading(102.0, {"r2": 1.0}))
    assert recent.runs_mostly({"alpha": 1}, {"r1"}) == {}


def test_a_round_no_longer_kept_counts_from_the_first_kept_after_it() -> None:
    recent = RecentAdmissions(rounds_kept=1)
    recent.record(1, _reading(100.0, {"r2": 1.0}))
    recent.record(2, _reading(102.0, {"r1": 0.4, "r2": _decayed(1.0, 2)}))
    recent.record(3, _reading(104.0, {"r1": _decayed(0.4, 2), "r2": _decayed(1.0, 4)}))
    # Round 1's reading is gone: counted from round 2's, nothing came since.
    assert recent.runs_mostly({"alpha": 1}, UP) == {}


def test_rates_average_over_the_last_rounds_only() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    for round_, rate in enumerate((9.0, 1.0, 2.0, 3.0)):
        recent.record(round_, _reading(100.0 + 2 * round_, {"r1": rate}))
    assert recent.mean_rates(3) == {("alpha", "r1"): 2.0}


def test_a_rate_missing_from_a_reading_counts_as_zero_there() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {"r1": 1.0, "r2": 2.0}))
    recent.record(2, _reading(102.0, {"r1": 3.0}))
    assert recent.mean_rates(5) == {("alpha", "r1"): 2.0, ("alpha", "r2"): 1.0}


def test_a_replica_back_from_down_counts_only_what_came_after_it_was_read_again() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {"r1": 0.2}, {"r1": "r1-process"}))
    # r2 was down at round 1; back, it still remembers admissions from before.
    recent.record(2, _reading(102.0, {"r1": 0.2, "r2": 2.0}))
    recent.record(3, _reading(104.0, {"r1": 0.4, "r2": _decayed(2.0, 2)}))
    # r1 admitted a couple since round 1; r2 nothing since it was read again.
    assert recent.runs_mostly({"alpha": 1}, UP) == {"alpha": "r1"}


def test_a_restarted_replica_counts_only_its_new_process() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {"r1": 3.0}))
    restarted = {"r1": "r1-new", "r2": "r2-process"}
    recent.record(2, _reading(102.0, {"r1": 0.1}, restarted))
    recent.record(3, _reading(104.0, {"r1": 0.5, "r2": 0.1}, restarted))
    # Counted from round 2: r1's new process admitted more than r2 since.
    assert recent.runs_mostly({"alpha": 1}, UP) == {"alpha": "r1"}


def test_readings_of_later_rounds_are_forgotten_when_the_clock_steps_back() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(5, _reading(110.0, {"r1": 9.0}))
    recent.record(3, _reading(106.0, {"r1": 1.0}))
    assert recent.mean_rates(5) == {("alpha", "r1"): 1.0}


def test_one_admission_places_an_adapter_not_placed_yet() -> None:
    recent = RecentAdmissions(rounds_kept=10)
    recent.record(1, _reading(100.0, {"r2": 0.5 / RATE_TIME_CONSTANT_S}))
    assert recent.runs_mostly({"alpha": None}, UP) == {"alpha": "r2"}
