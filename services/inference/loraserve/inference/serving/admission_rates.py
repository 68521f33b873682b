"""How many sequences of each adapter a replica admits per second, as clients read it to
place adapters over the fleet (`GetReplicaLoad`).

Each admission is weighted e^(-age / RATE_TIME_CONSTANT_S), so the rate is one over
about the last few seconds that the replica keeps, not one each client smooths from
whenever it started: clients that started apart read the same. And it is reported as of
the last whole RATE_GRID_S of the wall clock, so two clients that read it at different
moments after that boundary and before the next read the same numbers too: clients
place at multiples of their placement interval on the wall clock
(`loraserve.clients.balancing`), and read alike whenever their clocks are in step
within a poll (NTP keeps them within milliseconds).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FORGOTTEN_RATE", "RATE_GRID_S", "RATE_TIME_CONSTANT_S", "AdmissionRates"]

RATE_TIME_CONSTANT_S = 5.0
# A divisor of every client's placement interval (2 s by default).
RATE_GRID_S = 1.0
# A rate below which an adapter with nothing pending is forgotten: about 26 s after a
# lone admission, so a cold adapter asked for every few seconds keeps its place.
FORGOTTEN_RATE = 0.001


@dataclass(slots=True)
class _Rate:
    # The adapter's admissions, each weighted by its age, as of `at` (wall clock).
    weight: float = 0.0
    at: float = -math.inf
    # The weight as of the grid's boundary `boundary`, kept when the first admission
    # after that boundary came.
    at_boundary: float = 0.0
    boundary: float = -math.inf


class AdmissionRates:
    """Admissions per second by adapter label, each weighted by its age, as of the grid's
    last boundary."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._clock = wall_clock
        self._rates: dict[str, _Rate] = {}
        # The grid's boundary the last `rates` were as of.
        self.as_of = 0.0

    def admitted(self, adapter: str, sequences: int) -> None:
        now = self._clock()
        rate = self._rates.setdefault(adapter, _Rate())
        boundary = _boundary(now)
        if now < rate.at:
            # The wall clock stepped back: the weight holds as of now.
            rate.at, rate.at_boundary, rate.boundary = now, rate.weight, boundary
        elif rate.at < boundary:
            rate.at_boundary, rate.boundary = _decayed(rate.weight, boundary - rate.at), boundary
        rate.weight, rate.at = _decayed(rate.weight, now - rate.at) + sequences, now

    def rates(self, keep: Callable[[str], bool]) -> dict[str, float]:
        """Each adapter's rate as of the grid's last boundary (`as_of` from then on; a
        Poisson stream of rate r reads r on average); one under FORGOTTEN_RATE is
        forgotten unless `keep` (it has sequences pending)."""
        now = self._clock()
        boundary = _boundary(now)
        self.as_of = boundary
        rates: dict[str, float] = {}
        for adapter, rate in list(self._rates.items()):
            if rate.at < boundary:
                weight = _decayed(rate.weight, boundary - rate.at)
            else:
                # Admitted since the boundary (a clock stepped back reads the same).
                weight = rate.at_boundary
            value = weight / RATE_TIME_CONSTANT_S
            if value >= FORGOTTEN_RATE or keep(adapter):
                rates[adapter] = value
            elif _decayed(rate.weight, now - rate.at) / RATE_TIME_CONSTANT_S < FORGOTTEN_RATE:
                # Forgotten by what it weighs now: as of the boundary, an adapter first
                # admitted since weighs nothing, and its request, ended before the next
                # boundary, would go unreported.
                del self._rates[adapter]
        return rates


def _boundary(now: float) -> float:
    return math.floor(now / RATE_GRID_S) * RATE_GRID_S


def _decayed(weight: float, age_s: float) -> float:
    return weight * math.exp(-max(0.0, age_s) / RATE_TIME_CONSTANT_S) if weight else 0.0
