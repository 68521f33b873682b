"""Smoothing the replicas' per-adapter reports: each poll's reading moves the smoothed
value part of the way, and a value small enough is forgotten."""

from __future__ import annotations

import math

__all__ = ["FORGOTTEN", "smooth", "unbiased"]

# A smoothed value below which an adapter is forgotten on a replica: tens of seconds
# after its last request there at the default smoothing, so a cold adapter requested
# every few seconds keeps its place between them.
FORGOTTEN = 0.001


def smooth(
    smoothed: dict[tuple[str, str], float], reading: dict[tuple[str, str], float], alpha: float
) -> None:
    """Moves each smoothed value `alpha` of the way to its reading (none: zero),
    forgetting those below FORGOTTEN."""
    for key in reading.keys() | smoothed.keys():
        value = (1 - alpha) * smoothed.get(key, 0.0) + alpha * reading.get(key, 0.0)
        if value < FORGOTTEN:
            smoothed.pop(key, None)
        else:
            smoothed[key] = value


def unbiased(alpha: float, readings: int) -> float:
    """The factor that unbiases values smoothed from zero over `readings` readings: a
    client that just started has folded only a few readings into zero, and would read
    everything as a fraction of what it is (Adam's bias correction)."""
    if not readings or alpha >= 1:
        return 1.0
    # 1 - (1 - alpha)^readings, exact for an alpha too small for 1 - alpha.
    return -1.0 / math.expm1(readings * math.log1p(-alpha))
