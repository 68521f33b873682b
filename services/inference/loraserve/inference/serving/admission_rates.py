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

Beside each rate, the tokens a sequence of that adapter generated, over the sequences
that ended lately (weighted by age alike, as of the same boundary): how many engine
steps one holds its place for, whatever queue it waited in first. An adapter's
admissions times that is its share of the engine's work, so a few long streams weigh
more than many short requests at a higher rate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = ["FORGOTTEN_RATE", "RATE_GRID_S", "RATE_TIME_CONSTANT_S", "AdmissionRates"]

RATE_TIME_CONSTANT_S = 5.0
# A divisor of every client's placement interval (2 s by default).
RATE_GRID_S = 1.0
# A rate below which an adapter with nothing pending is forgotten: about 26 s after a
# lone admission, so a cold adapter asked for every few seconds keeps its place.
FORGOTTEN_RATE = 0.001


@dataclass(slots=True)
class _Decayed:
    """A sum of amounts, each weighted by its age, as of `at` (wall clock); and as of the
    grid's boundary `boundary`, kept when the first amount after that boundary came."""

    weight: float = 0.0
    at: float = -math.inf
    at_boundary: float = 0.0
    boundary: float = -math.inf

    def add(self, now: float, amount: float) -> None:
        boundary = _boundary(now)
        if now < self.at:
            # The wall clock stepped back: the weight holds as of now.
            self.at, self.at_boundary, self.boundary = now, self.weight, boundary
        elif self.at < boundary:
            self.at_boundary, self.boundary = _decayed(self.weight, boundary - self.at), boundary
        self.weight, self.at = _decayed(self.weight, now - self.at) + amount, now

    def as_of(self, boundary: float) -> float:
        """The weight as of `boundary`, the grid's last: what came since is left out (a
        clock stepped back reads the same)."""
        if self.at < boundary:
            return _decayed(self.weight, boundary - self.at)
        return self.at_boundary


@dataclass(slots=True)
class _Adapter:
    # Sequences admitted; sequences that ran in the engine and ended, and the tokens
    # they generated.
    admitted: _Decayed = field(default_factory=_Decayed)
    ran: _Decayed = field(default_factory=_Decayed)
    tokens: _Decayed = field(default_factory=_Decayed)


class AdmissionRates:
    """Admissions per second by adapter label, each weighted by its age, and the tokens
    each of its sequences generated, as of the grid's last boundary."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._clock = wall_clock
        self._adapters: dict[str, _Adapter] = {}
        # The grid's boundary the last `rates` were as of.
        self.as_of = 0.0

    def admitted(self, adapter: str, sequences: int) -> None:
        self._adapters.setdefault(adapter, _Adapter()).admitted.add(self._clock(), sequences)

    def ran(self, adapter: str, sequences: int, generated: int) -> None:
        """Counts `sequences` of `adapter` (one request) that ran in the engine and ended,
        having generated `generated` tokens between them."""
        state = self._adapters.get(adapter)
        if state is not None:
            now = self._clock()
            state.ran.add(now, sequences)
            state.tokens.add(now, max(generated, sequences))

    def rates(self, keep: Callable[[str], bool]) -> dict[str, float]:
        """Each adapter's rate as of the grid's last boundary (`as_of` from then on; a
        Poisson stream of rate r reads r on average); one under FORGOTTEN_RATE is
        forgotten unless `keep` (it has sequences pending)."""
        now = self._clock()
        boundary = _boundary(now)
        self.as_of = boundary
        rates: dict[str, float] = {}
        for adapter, state in list(self._adapters.items()):
            value = state.admitted.as_of(boundary) / RATE_TIME_CONSTANT_S
            if value >= FORGOTTEN_RATE or keep(adapter):
                rates[adapter] = value
            elif (
                _decayed(state.admitted.weight, now - state.admitted.at) / RATE_TIME_CONSTANT_S
                < FORGOTTEN_RATE
            ):
                # Forgotten by what it weighs now: as of the boundary, an adapter first
                # admitted since weighs nothing, and its request, ended before the next
                # boundary, would go unreported.
                del self._adapters[adapter]
        return rates

    def tokens_per_sequence(self, adapters: Iterable[str], as_of: float) -> dict[str, float]:
        """Of `adapters` (those `rates` reported), the tokens each sequence that ran
        generated, weighted by how lately it ended, as of `as_of` (the boundary those
        rates were as of): only those with a sequence ended by then; at least 1."""
        means: dict[str, float] = {}
        for adapter in adapters:
            state = self._adapters.get(adapter)
            ran = state.ran.as_of(as_of) if state is not None else 0.0
            if state is not None and ran > 0:
                means[adapter] = max(1.0, state.tokens.as_of(as_of) / ran)
        return means


def _boundary(now: float) -> float:
    return math.floor(now / RATE_GRID_S) * RATE_GRID_S


def _decayed(weight: float, age_s: float) -> float:
    return weight * math.exp(-max(0.0, age_s) / RATE_TIME_CONSTANT_S) if weight else 0.0
