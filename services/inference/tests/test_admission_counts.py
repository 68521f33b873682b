"""What admission reports of each adapter for bounded-load routing: the sequences
pending, and those admitted lately."""

from __future__ import annotations

from loraserve.inference.serving.admission import ADMITTED_IDLE_S, Admission


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_admission_counts_the_sequences_admitted_by_adapter_after_they_finish() -> None:
    admission = Admission(8, clock=Clock())
    with admission.admit(2, "alpha"):
        pass
    with admission.admit(1, "alpha"), admission.admit(1, "beta"):
        pass
    assert admission.admitted_by_adapter() == {"alpha": 3, "beta": 1}
    assert admission.pending_by_adapter() == {}


def test_admission_drops_an_adapter_idle_past_the_window_and_counts_it_from_zero() -> None:
    clock = Clock()
    admission = Admission(8, clock=clock)
    with admission.admit(2, "alpha"):
        pass
    clock.now += ADMITTED_IDLE_S + 1
    assert admission.admitted_by_adapter() == {}
    with admission.admit(1, "alpha"):
        pass
    assert admission.admitted_by_adapter() == {"alpha": 1}


def test_admission_keeps_counting_an_adapter_still_pending_past_the_window() -> None:
    clock = Clock()
    admission = Admission(8, clock=clock)
    with admission.admit(1, "alpha"):
        clock.now += ADMITTED_IDLE_S + 1
        assert admission.admitted_by_adapter() == {"alpha": 1}
