"""Each adapter's recent demand on the engine, for fair admission: the rate it sends
sequences at (a request counts its n, each sequence taking a place in the engine),
judged over the last seconds rather than by the places it holds at this instant, and
how long its requests hold their places, so that the places an adapter will need are
its rate x its mean hold (Little's law).

A rate is exponentially decayed (time constant `tau_s`): every request adds n / tau,
and the sum decays by e^(-dt / tau), so it estimates sequences per second over about
the last tau seconds. Each adapter has two: one over `tau_s`, steady enough to judge
who is over its share, and one over `fast_tau_s`, quick to show a flood that has just
begun. Decay is computed on access from the time of the last request; nothing runs in
the background. A hold is an exponentially weighted mean over about the last `span`
requests of that adapter; so is its hold in a full engine, over the requests that held
their place while (on average) every place was taken: on an engine whose step time
grows with the batch (a CPU one) a request holds its place longer in a full batch, and
what the adapters would ask for if let in is judged with those.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Level:
    """A decayed rate: `value` sequences/s as of `at`, decaying since."""

    value: float = 0.0
    at: float = 0.0

    def now(self, now: float, tau_s: float) -> float:
        return self.value * math.exp(-(now - self.at) / tau_s)

    def add(self, now: float, tau_s: float, sequences: int) -> None:
        self.value = self.now(now, tau_s) + sequences / tau_s
        self.at = now


class MeanHold:
    """The mean seconds a request holds its place, over about the last `span` requests
    (an exponentially weighted mean; None until the first one left)."""

    def __init__(self, span: int) -> None:
        if span < 1:
            raise ValueError(f"span must be at least 1, got {span}")
        self._alpha = 1.0 / span
        self.seconds: float | None = None

    def left(self, held_s: float) -> None:
        """Counts one request that held its place for `held_s` seconds."""
        if self.seconds is None:
            self.seconds = held_s
        else:
            self.seconds += self._alpha * (held_s - self.seconds)


@dataclass
class _Adapter:
    """One adapter's recent rates, mean hold and mean hold in a full engine."""

    level: _Level
    fast: _Level
    hold: MeanHold
    full: MeanHold


class RecentDemand:
    """Recent sequences/s per adapter and in all, and each adapter's mean hold; which
    adapters are over their share, and how many places the others will need."""

    def __init__(
        self,
        tau_s: float,
        fast_tau_s: float,
        span: int,
        weight: Callable[[str], float],
        clock: Callable[[], float],
    ) -> None:
        if not 0 < fast_tau_s <= tau_s:
            raise ValueError(
                f"taus must be positive, the fast one the shorter: {tau_s}, {fast_tau_s}"
            )
        self._tau_s = tau_s
        self._fast_tau_s = fast_tau_s
        self._span = span
        self._weight = weight
        self._clock = clock
        self._total = _Level()
        # Every adapter's requests, for one whose own have not left yet.
        self._hold = MeanHold(span)
        # Adapters that sent within the last tau: the ones that share the total.
        self._adapters: dict[str, _Adapter] = {}

    def arrived(self, adapter: str, sequences: int = 1) -> None:
        """Counts one request of `adapter`, of `sequences` places, now."""
        now = self._clock()
        self._total.add(now, self._tau_s, sequences)
        state = self._adapters.get(adapter)
        if state is None:
            state = _Adapter(
                _Level(at=now), _Level(at=now), MeanHold(self._span), MeanHold(self._span)
            )
            self._adapters[adapter] = state
        state.level.add(now, self._tau_s, sequences)
        state.fast.add(now, self._fast_tau_s, sequences)

    def left(self, adapter: str, held_s: float, full: bool = False) -> None:
        """Counts one request of `adapter` that held its place for `held_s` seconds,
        in an engine with every place taken if `full`."""
        self._hold.left(held_s)
        state = self._adapters.get(adapter)
        if state is not None:
            state.hold.left(held_s)
            if full:
                state.full.left(held_s)

    def rates(self) -> dict[str, float]:
        """Each adapter's recent rate, of those seen within the last tau (forgetting the
        others: their rate stays in the total as it decays). O(adapters)."""
        now = self._clock()
        rates: dict[str, float] = {}
        for adapter, state in list(self._adapters.items()):
            if now - state.level.at > self._tau_s:
                del self._adapters[adapter]
                continue
            rates[adapter] = state.level.now(now, self._tau_s)
        return rates

    def fast_rates(self, adapters: dict[str, float]) -> dict[str, float]:
        """The rate over the fast time constant of each of `adapters` (from `rates()`)."""
        now = self._clock()
        return {a: self._adapters[a].fast.now(now, self._fast_tau_s) for a in adapters}

    def over(self, rates: dict[str, float], margin: float) -> set[str]:
        """Of `rates` (from `rates()`), the adapters above `margin` x their fair rate:
        the total rate x their weight / the sum of the weights of the adapters seen
        within the last tau. A lone adapter's fair rate is the total, so with
        `margin` >= 1 it is never over."""
        weights = sum(self._weight(a) for a in rates)
        total = self._total.now(self._clock(), self._tau_s)
        return {a for a, rate in rates.items() if rate * weights > margin * total * self._weight(a)}

    def places(self, rates: dict[str, float], full: bool = False) -> float:
        """The places the adapters of `rates` are expected to hold: each one's rate x
        its mean hold (every adapter's until one of its own requests left); with
        `full`, in a full engine: its mean hold there where longer (as of the last
        time the engine was full, which a flood held back leaves it seldom)."""
        overall = self._hold.seconds or 0.0
        total = 0.0
        for adapter, rate in rates.items():
            state = self._adapters.get(adapter)
            own = state.hold.seconds if state is not None else None
            hold = overall if own is None else own
            if full and state is not None and state.full.seconds is not None:
                hold = max(hold, state.full.seconds)
            total += rate * hold
        return total
