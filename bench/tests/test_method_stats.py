"""The statistics every benchmark verdict rests on: the bootstrap interval of a median,
the verdict rule (met only when the interval clears the goal), the resolution a goal
needs and the noise check that fails a benchmark noisier than that."""

from __future__ import annotations

import math

import pytest

from bench.method.report import Section
from bench.method.stats import (
    Estimate,
    median_interval,
    noise_width,
    paired_difference,
    paired_ratio,
    resolution,
    unpaired_ratio,
    verdict,
)


def test_the_interval_of_identical_samples_is_the_sample() -> None:
    assert median_interval([2.0] * 7) == Estimate(2.0, 2.0, 2.0, 7)


def test_five_samples_give_their_range_as_the_interval() -> None:
    # Resampling 5 values, the median falls on the smallest with probability ~6 %:
    # the 2.5 % and 97.5 % points of the bootstrap are the extremes.
    estimate = median_interval([1.0, 1.2, 1.1, 0.9, 1.05])
    assert (estimate.value, estimate.low, estimate.high, estimate.n) == (1.05, 0.9, 1.2, 5)


def test_the_interval_narrows_around_the_median_with_more_samples() -> None:
    wide = median_interval([0.9, 1.0, 1.1, 1.2, 1.3])
    many = median_interval([0.9, 1.0, 1.1, 1.2, 1.3] * 8)
    assert many.low > wide.low
    assert many.high < wide.high
    assert many.low <= many.value <= many.high


def test_the_interval_is_the_same_every_time() -> None:
    samples = [3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.6]
    assert median_interval(samples) == median_interval(samples)


def test_nan_samples_are_left_out_and_none_give_nan() -> None:
    assert median_interval([1.0, math.nan, 3.0]).n == 2
    assert math.isnan(median_interval([math.nan]).value)


def test_paired_ratios_are_taken_repeat_by_repeat() -> None:
    estimate = paired_ratio([10.0, 20.0, 30.0, 40.0, 50.0], [10.0, 10.0, 30.0, 20.0, 50.0])
    assert estimate.value == 1.0
    assert (estimate.low, estimate.high) == (1.0, 2.0)
    with pytest.raises(ValueError, match="as many repeats"):
        paired_ratio([1.0], [1.0, 2.0])


def test_paired_differences_are_taken_pair_by_pair() -> None:
    assert paired_difference([5.0, 7.0, 9.0], [1.0, 2.0, 3.0]).value == 5.0


def test_an_unpaired_ratio_is_of_the_medians() -> None:
    estimate = unpaired_ratio([9.0, 10.0, 11.0, 10.0, 10.0], [20.0, 19.0, 21.0, 20.0, 20.0])
    assert estimate.value == 0.5
    assert estimate.low <= 0.5 <= estimate.high


def _est(value: float, low: float, high: float, n: int = 5) -> Estimate:
    return Estimate(value, low, high, n)


@pytest.mark.parametrize(
    ("estimate", "op", "threshold", "expected"),
    [
        (_est(1.02, 0.96, 1.08), ">=", 0.95, "met"),
        (_est(0.90, 0.85, 0.94), ">=", 0.95, "missed"),
        (_est(0.97, 0.92, 1.01), ">=", 0.95, "inconclusive"),
        (_est(1.10, 1.05, 1.18), "<=", 1.2, "met"),
        (_est(1.30, 1.21, 1.40), "<=", 1.2, "missed"),
        (_est(1.15, 1.05, 1.25), "<=", 1.2, "inconclusive"),
        (_est(1.02, 1.00, 1.04), ">", 1.0, "inconclusive"),
        (_est(1.02, 1.01, 1.04), ">", 1.0, "met"),
        (_est(1.02, 0.96, 1.08, n=4), ">=", 0.95, "reported"),
    ],
)
def test_a_verdict_follows_the_interval(
    estimate: Estimate, op: str, threshold: float, expected: str
) -> None:
    assert verdict(estimate, op, threshold) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("estimate", "expected"),
    [
        (_est(1.01, 0.98, 1.05), "met"),
        (_est(0.99, 0.98, 1.02), "inconclusive"),  # the median below the goal
        (_est(0.985, 0.975, 0.99), "missed"),  # measurably slower than the goal
        (_est(1.0, 0.95, 1.05), "inconclusive"),
    ],
)
def test_a_goal_of_one_clearing_097_tolerates_three_percent(
    estimate: Estimate, expected: str
) -> None:
    assert verdict(estimate, ">=", 1.0, clear=0.97) == expected


def test_a_goal_resolves_its_distance_from_no_difference_and_at_least_3_percent() -> None:
    assert resolution(">=", 0.85) == pytest.approx(0.15)
    assert resolution("<=", 0.5) == pytest.approx(0.5)
    assert resolution(">=", 1.0) == pytest.approx(0.03)
    assert resolution(">=", 1.0, clear=0.9) == pytest.approx(0.1)


def test_noise_is_how_far_an_arm_against_itself_strays_from_one() -> None:
    assert noise_width(_est(1.0, 0.93, 1.02)) == pytest.approx(0.07)
    assert noise_width(_est(1.0, 1.0, 1.0)) == 0.0


def test_noise_wider_than_the_goals_resolve_fails_the_benchmark() -> None:
    section = Section(8, "against vLLM")
    section.goal(
        "gRPC / vllm serve", _est(1.0, 0.99, 1.02), ">=", 1.0, ".2f", clear=0.97, metric="tok"
    )
    section.noise("gRPC twice", _est(1.0, 0.94, 1.03), "tok")
    section.finish()
    assert section.noises[0].verdict == "too noisy"
    assert "too noisy" in section.error
    assert section.noises[0].limit == pytest.approx(0.03)


def test_noise_within_the_resolution_passes_and_other_metrics_do_not_count() -> None:
    section = Section(3, "slots")
    section.goal("32 / 8", _est(0.8, 0.75, 0.84), ">=", 0.85, ".2f", metric="tok")
    section.noise("8/8 twice", _est(1.0, 0.9, 1.1), "tok")
    section.noise("8/8 TTFT twice", _est(1.0, 0.5, 1.5), "ttft")
    section.finish()
    assert [n.verdict for n in section.noises] == ["ok", "no goal on it"]
    assert not section.error


def test_noise_of_a_smoke_run_is_recorded_not_judged() -> None:
    section = Section(1, "overhead")
    section.goal("gRPC / direct", _est(1.0, 0.9, 1.1, n=2), ">=", 0.95, ".2f", metric="tok")
    section.noise("gRPC twice", _est(1.0, 0.5, 1.5, n=2), "tok")
    section.finish()
    assert section.goals[0].verdict == "reported"
    assert not section.error


def test_a_single_sample_is_reported_never_judged() -> None:
    section = Section(7, "memory")
    assert section.goal("memory per adapter", 1.3, "<=", 2.0, ".1f") == "reported"
    assert section.goals[0].value == "1.3 n=1"
