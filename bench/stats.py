"""Small statistics for noisy measurements: medians and percentiles of samples."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


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
