"""What admission reports of each adapter for bounded-load routing: how many sequences it
admits per second lately, as of the wall clock's last whole RATE_GRID_S."""

from __future__ import annotations

import math
import random

import pytest

from loraserve.inference.serving.admission import Admission
from loraserve.inference.serving.admission_rates import (
    FORGOTTEN_RATE,
    RATE_GRID_S,
    RATE_TIME_CONSTANT_S,
    AdmissionRates,
)
from loraserve.testing.fakes.clock import ManualClock


def _admission(clock: ManualClock) -> Admission:
    return Admission(8, rates=AdmissionRates(clock))


def test_admission_rates_weigh_each_sequence_by_its_age() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(2, "alpha"):
        pass
    clock.now += RATE_TIME_CONSTANT_S
    with admission.admit(1, "alpha"), admission.admit(1, "beta"):
        pass
    clock.now += RATE_GRID_S
    rates = admission.admission_rates()
    decay = math.exp(-RATE_GRID_S / RATE_TIME_CONSTANT_S)
    assert rates == pytest.approx(
        {
            "alpha": (2 / math.e + 1) * decay / RATE_TIME_CONSTANT_S,
            "beta": decay / RATE_TIME_CONSTANT_S,
        }
    )
    assert admission.pending_by_adapter() == {}


def test_admission_rates_read_alike_anywhere_between_two_boundaries_of_the_grid() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(3, "alpha"):
        pass
    clock.now += RATE_GRID_S
    first = admission.admission_rates()
    for _ in range(3):
        clock.now += RATE_GRID_S / 4
        with admission.admit(1, "alpha"):
            pass
        assert admission.admission_rates() == first
    clock.now += RATE_GRID_S / 4
    assert admission.admission_rates()["alpha"] > first["alpha"]


def test_admission_rate_of_a_steady_stream_reads_its_rate() -> None:
    clock, draws = ManualClock(), random.Random(7)
    admission = _admission(clock)
    readings = []
    for _ in range(20_000):
        clock.now += draws.expovariate(4.0)
        # Poisson arrivals see time averages.
        readings.append(admission.admission_rates().get("alpha", 0.0))
        with admission.admit(1, "alpha"):
            pass
    assert sum(readings) / len(readings) == pytest.approx(4.0, rel=0.05)


def test_admission_forgets_an_idle_adapter_and_rates_it_from_zero_again() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(2, "alpha"):
        pass
    clock.now += RATE_TIME_CONSTANT_S * math.log(2 / RATE_TIME_CONSTANT_S / FORGOTTEN_RATE) + 2
    assert admission.admission_rates() == {}
    with admission.admit(1, "alpha"):
        pass
    clock.now += RATE_GRID_S
    assert admission.admission_rates()["alpha"] >= 1 / RATE_TIME_CONSTANT_S / math.e


def test_admission_rates_report_a_lone_request_read_before_the_next_boundary_then_after() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(1, "alpha"):
        pass
    # Polled within the second it ended in (clients poll every 0.1 s): not reported yet,
    # as of the boundary before it, and not forgotten for that.
    clock.now += RATE_GRID_S / 4
    assert admission.admission_rates() == {}
    clock.now += RATE_GRID_S
    assert admission.admission_rates()["alpha"] > 0


def test_admission_keeps_reporting_an_adapter_still_pending_past_forgetting() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(1, "alpha"):
        clock.now += 3600
        assert admission.admission_rates().keys() == {"alpha"}


def test_admission_rates_stay_sane_when_the_wall_clock_steps_back() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(1, "alpha"):
        pass
    clock.now += RATE_GRID_S
    before = admission.admission_rates()
    clock.now -= 10 * RATE_GRID_S
    with admission.admit(1, "alpha"):
        pass
    after = admission.admission_rates()
    assert all(math.isfinite(r) and r >= 0 for r in after.values())
    assert after["alpha"] <= before["alpha"] + 2 / RATE_TIME_CONSTANT_S


def test_admission_rates_say_the_second_they_are_as_of() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    clock.now = 1000.7
    admission.admission_rates()
    assert admission.admission_rates_as_of == 1000.0


def test_tokens_per_sequence_weigh_each_ended_sequence_by_its_age() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(2, "alpha"):
        admission.ran("alpha", 2, 40)
    clock.now += RATE_TIME_CONSTANT_S
    with admission.admit(1, "alpha"):
        admission.ran("alpha", 1, 4)
    clock.now += RATE_GRID_S
    rates = admission.admission_rates()
    # 2 sequences of 20 tokens, each weighted 1/e, beside 1 of 4 weighted 1.
    expected = (40 / math.e + 4) / (2 / math.e + 1)
    assert admission.tokens_per_sequence(rates) == pytest.approx({"alpha": expected})


def test_tokens_per_sequence_read_alike_anywhere_between_two_boundaries_of_the_grid() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(1, "alpha"):
        admission.ran("alpha", 1, 10)
    clock.now += RATE_GRID_S
    first = admission.tokens_per_sequence(admission.admission_rates())
    clock.now += RATE_GRID_S / 2
    with admission.admit(1, "alpha"):
        admission.ran("alpha", 1, 100)
    assert admission.tokens_per_sequence(admission.admission_rates()) == first
    assert first == pytest.approx({"alpha": 10})


def test_tokens_per_sequence_name_only_adapters_with_a_sequence_ended_and_at_least_one() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(1, "alpha"), admission.admit(1, "beta"), admission.admit(1, "gamma"):
        admission.ran("alpha", 1, 0)
        admission.ran("beta", 1, 7)
        clock.now += RATE_GRID_S
        rates = admission.admission_rates()
    assert rates.keys() == {"alpha", "beta", "gamma"}
    assert admission.tokens_per_sequence(rates) == pytest.approx({"alpha": 1.0, "beta": 7.0})


def test_tokens_per_sequence_stay_sane_when_the_wall_clock_steps_back() -> None:
    clock = ManualClock()
    admission = _admission(clock)
    with admission.admit(1, "alpha"):
        admission.ran("alpha", 1, 10)
    clock.now += RATE_GRID_S
    admission.admission_rates()
    clock.now -= 10 * RATE_GRID_S
    with admission.admit(1, "alpha"):
        admission.ran("alpha", 1, 30)
    tokens = admission.tokens_per_sequence(admission.admission_rates())
    assert 10 <= tokens["alpha"] <= 30


def test_a_sequence_that_ran_for_an_adapter_forgotten_meanwhile_is_not_counted() -> None:
    admission = _admission(ManualClock())
    admission.ran("alpha", 1, 10)
    assert admission.tokens_per_sequence(["alpha"]) == {}
