"""Each adapter's recent rate of requests and how long a request holds its place in
the engine, for fair admission: who asks for more than its share, judged over the last
seconds rather than by the requests it holds at this instant, and how many places the
others will need (their rates x the mean hold, Little's law).

A rate is exponentially decayed (time constant `tau_s`): every request adds 1 / tau,
and the sum decays by e^(-dt / tau), so it estimates requests per second over about
the last tau seconds. Decay is computed on access from the time of the last request;
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
    """Recent requests/s per adapter and in all; which adapters are over their share."""

    def __init__(self, tau_s: float, weight: Callable[[str], float], clock: Callable[[], float]):
        if tau_s <= 0:
            raise ValueError(f"tau must be positive, got {tau_s}")
        self._tau_s = tau_s
        self._weight = weight
        self._clock = clock
        self._total = _Level()
        # Adapters admitted within the last tau: the ones that share the total.
        self._adapters: dict[str, _Level] = {}

    def arrived(self, adapter: str) -> None:
        """Counts one request of `adapter` now."""
        now = self._clock()
        self._total.add(now, self._tau_s)
        self._adapters.setdefault(adapter, _Level(at=now)).add(now, self._tau_s)

    def rates(self) -> dict[str, float]:
        """Each adapter's recent rate, of those seen within the last tau (forgetting the
        others: their rate stays in the total as it decays). O(adapters)."""
        now = self._clock()
        rates: dict[str, float] = {}
        for adapter, level in list(self._adapters.items()):
            if now - level.at > self._tau_s:
                del self._adapters[adapter]
                continue
            rates[adapter] = level.now(now, self._tau_s)
        return rates

    def over(self, rates: dict[str, float], margin: float) -> set[str]:
        """Of `rates` (from `rates()`), the adapters above `margin` x their fair rate:
        the total rate x their weight / the sum of the weights of the adapters seen
        within the last tau. A lone adapter's fair rate is the total, so with
        `margin` >= 1 it is never over."""
        weights = sum(self._weight(a) for a in rates)
        total = self._total.now(self._clock(), self._tau_s)
        return {a for a, rate in rates.items() if rate * weights > margin * total * self._weight(a)}


class MeanHold:
    """The mean seconds a request holds its place, over about the last `span` requests
    (an exponentially weighted mean; 0 until the first one left)."""

    def __init__(self, span: int) -> None:
        if span < 1:
            raise ValueError(f"span must be at least 1, got {span}")
        self._alpha = 1.0 / span
        self._mean: float | None = None

    @property
    def seconds(self) -> float:
        return self._mean or 0.0

    def left(self, held_s: float) -> None:
        """Counts one request that held its place for `held_s` seconds."""
        if self._mean is None:
            self._mean = held_s
        else:
            self._mean += self._alpha * (held_s - self._mean)
