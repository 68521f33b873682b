"""Each adapter's recent rate of admission into the engine, for fair admission's
headroom: who is taking more than its share, judged over the last seconds rather than
by the requests it holds at this instant.

A rate is exponentially decayed (time constant `tau_s`): every admission adds 1 / tau,
and the sum decays by e^(-dt / tau), so it estimates admissions per second over about
the last tau seconds. Decay is computed on access from the time of the last admission;
nothing runs in the background.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Level:
    """A decayed rate: `value` admissions/s as of `at`, decaying since."""

    value: float = 0.0
    at: float = 0.0

    def now(self, now: float, tau_s: float) -> float:
        return self.value * math.exp(-(now - self.at) / tau_s)

    def add(self, now: float, tau_s: float) -> None:
        self.value = self.now(now, tau_s) + 1.0 / tau_s
        self.at = now


class RecentRates:
    """Recent admissions/s per adapter and in all; which adapters are over their share."""

    def __init__(self, tau_s: float, weight: Callable[[str], float], clock: Callable[[], float]):
        if tau_s <= 0:
            raise ValueError(f"tau must be positive, got {tau_s}")
        self._tau_s = tau_s
        self._weight = weight
        self._clock = clock
        self._total = _Level()
        # Adapters admitted within the last tau: the ones that share the total.
        self._adapters: dict[str, _Level] = {}

    def admitted(self, adapter: str) -> None:
        """Counts one admission of `adapter` now."""
        now = self._clock()
        self._total.add(now, self._tau_s)
        self._adapters.setdefault(adapter, _Level(at=now)).add(now, self._tau_s)

    def over(self, margin: float) -> set[str]:
        """The adapters whose recent rate is above `margin` x their fair rate: the total
        rate x their weight / the sum of the weights of the adapters admitted within the
        last tau. A lone adapter's fair rate is the total, so with `margin` >= 1 it is
        never over. O(adapters); forgets those not admitted within tau (their rate stays
        in the total as it decays)."""
        now = self._clock()
        rates: dict[str, float] = {}
        weights = 0.0
        for adapter, level in list(self._adapters.items()):
            if now - level.at > self._tau_s:
                del self._adapters[adapter]
                continue
            rates[adapter] = level.now(now, self._tau_s)
            weights += self._weight(adapter)
        total = self._total.now(now, self._tau_s)
        return {a for a, rate in rates.items() if rate * weights > margin * total * self._weight(a)}
