"""What admission reports of each adapter for bounded-load routing: the sequences
pending, and how many it admits per second lately."""

from __future__ import annotations

import math
import random

import pytest

from loraserve.inference.serving.admission import FORGOTTEN_RATE, RATE_TIME_CONSTANT_S, Admission


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_admission_rates_weigh_each_sequence_by_its_age() -> None:
    clock = Clock()
    admission = Admission(8, clock=clock)
    with admission.admit(2, "alpha"):
        pass
    clock.now += RATE_TIME_CONSTANT_S
    with admission.admit(1, "alpha"), admission.admit(1, "beta"):
        pass
    rates = admission.admission_rates()
    assert rates == pytest.approx(
        {"alpha": (2 / math.e + 1) / RATE_TIME_CONSTANT_S, "beta": 1 / RATE_TIME_CONSTANT_S}
    )
    assert admission.pending_by_adapter() == {}


def test_admission_rate_of_a_steady_stream_reads_its_rate() -> None:
    clock, draws = Clock(), random.Random(7)
    admission = Admission(8, clock=clock)
    readings = []
    for _ in range(20_000):
        clock.now += draws.expovariate(4.0)
        # Read just before each arrival: Poisson arrivals see time averages.
        readings.append(admission.admission_rates().get("alpha", 0.0))
        with admission.admit(1, "alpha"):
            pass
    assert sum(readings) / len(readings) == pytest.approx(4.0, rel=0.05)


def test_admission_forgets_an_idle_adapter_and_rates_it_from_zero_again() -> None:
    clock = Clock()
    admission = Admission(8, clock=clock)
    with admission.admit(2, "alpha"):
        pass
    clock.now += RATE_TIME_CONSTANT_S * math.log(2 / RATE_TIME_CONSTANT_S / FORGOTTEN_RATE) + 1
    assert admission.admission_rates() == {}
    with admission.admit(1, "alpha"):
        pass
    assert admission.admission_rates() == pytest.approx({"alpha": 1 / RATE_TIME_CONSTANT_S})


def test_admission_keeps_reporting_an_adapter_still_pending_past_forgetting() -> None:
    clock = Clock()
    admission = Admission(8, clock=clock)
    with admission.admit(1, "alpha"):
        clock.now += 3600
        assert admission.admission_rates().keys() == {"alpha"}
