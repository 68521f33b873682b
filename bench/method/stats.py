"""Statistics for noisy measurements: percentiles, bootstrap intervals of medians, and
the verdict rule every benchmark goal follows.

A figure is the median of its repeats (for a ratio of two arms: of the per-repeat
ratios, the arms having run side by side in each repeat), with a 95 % percentile
bootstrap interval of that median. A goal is *met* only when the whole interval lies on
the goal's side, *missed* when it lies wholly on the wrong side, *inconclusive*
otherwise; with fewer than MIN_REPEATS samples the figure is *reported*, never judged.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

MIN_REPEATS = 5
BOOTSTRAP_RESAMPLES = 4000
CONFIDENCE = 0.95
# The resampling is seeded: the same samples always give the same interval.
_BOOTSTRAP_SEED = 23

Op = Literal[">=", "<=", ">", "<"]
Verdict = Literal["met", "missed", "inconclusive", "reported"]


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = math.ceil(position)
    if low == high:
        return ordered[low]
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def median(samples: Sequence[float]) -> float:
    return statistics.median(samples) if samples else math.nan


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else math.nan


@dataclass(frozen=True)
class Estimate:
    """The median of `n` finite samples and its bootstrap interval [low, high]."""

    value: float
    low: float
    high: float
    n: int

    def text(self, fmt: str) -> str:
        """`1.02 [0.98, 1.05] n=5` (NaN as n/a)."""
        if math.isnan(self.value):
            return "n/a"
        if self.n < 2:
            return f"{format(self.value, fmt)} n={self.n}"
        return (
            f"{format(self.value, fmt)} [{format(self.low, fmt)}, {format(self.high, fmt)}] "
            f"n={self.n}"
        )


def _finite(samples: Sequence[float]) -> list[float]:
    return [float(s) for s in samples if not math.isnan(s) and not math.isinf(s)]


def median_interval(samples: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES) -> Estimate:
    """Median of the finite samples with its 95 % percentile-bootstrap interval."""
    data = _finite(samples)
    if not data:
        return Estimate(math.nan, math.nan, math.nan, 0)
    value = median(data)
    if len(data) == 1:
        return Estimate(value, value, value, 1)
    rng = random.Random(_BOOTSTRAP_SEED)
    size = len(data)
    medians = sorted(statistics.median(rng.choices(data, k=size)) for _ in range(resamples))
    tail = (1 - CONFIDENCE) / 2
    return Estimate(
        value, percentile(medians, 100 * tail), percentile(medians, 100 * (1 - tail)), size
    )


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Per-repeat ratios of two arms that ran side by side in each repeat."""
    if len(numerators) != len(denominators):
        raise ValueError(
            f"paired arms need as many repeats: {len(numerators)} vs {len(denominators)}"
        )
    return [ratio(a, b) for a, b in zip(numerators, denominators, strict=True)]


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> Estimate:
    """Median of the per-repeat ratios, with its interval."""
    return median_interval(paired_ratios(numerators, denominators))


def paired_difference(firsts: Sequence[float], seconds: Sequence[float]) -> Estimate:
    """Median of the per-pair differences first - second, with its interval."""
    if len(firsts) != len(seconds):
        raise ValueError(f"paired samples need as many: {len(firsts)} vs {len(seconds)}")
    return median_interval([a - b for a, b in zip(firsts, seconds, strict=True)])


def unpaired_ratio(
    numerators: Sequence[float],
    denominators: Sequence[float],
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Estimate:
    """median(numerators) / median(denominators) of two independent samples, each
    resampled on its own; n is the smaller sample's size."""
    top, bottom = _finite(numerators), _finite(denominators)
    if not top or not bottom:
        return Estimate(math.nan, math.nan, math.nan, 0)
    value = ratio(median(top), median(bottom))
    rng = random.Random(_BOOTSTRAP_SEED)
    ratios = sorted(
        ratio(
            statistics.median(rng.choices(top, k=len(top))),
            statistics.median(rng.choices(bottom, k=len(bottom))),
        )
        for _ in range(resamples)
    )
    ratios = _finite(ratios)
    tail = (1 - CONFIDENCE) / 2
    return Estimate(
        value,
        percentile(ratios, 100 * tail),
        percentile(ratios, 100 * (1 - tail)),
        min(len(top), len(bottom)),
    )


def _holds(value: float, op: Op, threshold: float) -> bool:
    return {
        ">=": value >= threshold,
        ">": value > threshold,
        "<=": value <= threshold,
        "<": value < threshold,
    }[op]


def verdict(estimate: Estimate, op: Op, threshold: float, clear: float | None = None) -> Verdict:
    """The goal `figure OP threshold` judged on the estimate's interval.

    met: the median meets the goal and the whole interval lies on its side (beyond
    `clear` when given: "goal >= 1.0, the interval clearing 0.97" tolerates that much
    noise below the goal); missed: the whole interval lies on the wrong side of the
    threshold; inconclusive otherwise. Fewer than MIN_REPEATS samples: reported.
    """
    if estimate.n < MIN_REPEATS or math.isnan(estimate.value):
        return "reported"
    bound = threshold if clear is None else clear
    low_side = op in (">=", ">")
    edge = estimate.low if low_side else estimate.high
    if _holds(estimate.value, op, threshold) and _holds(edge, op, bound):
        return "met"
    far = estimate.high if low_side else estimate.low
    if not _holds(far, op, threshold):
        return "missed"
    return "inconclusive"


def resolution(op: Op, threshold: float, clear: float | None = None) -> float:
    """The smallest relative difference a ratio goal must tell apart: the gap between
    "no difference" (1.0) and its threshold (or between threshold and `clear`), and at
    least 3 %. Noise wider than this makes the goal's verdict meaningless."""
    if clear is not None:
        return max(abs(threshold - clear), 0.03)
    return max(abs(1.0 - threshold), 0.03)


def noise_width(estimate: Estimate) -> float:
    """How far from 1.0 the interval of an arm's ratio to itself reaches (0.1: two
    measurements of the same thing differ by up to 10 %)."""
    if math.isnan(estimate.low):
        return math.nan
    return max(estimate.high - 1.0, 1.0 - estimate.low, 0.0)
