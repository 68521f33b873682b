"""Where each adapter has run lately: the admissions the replicas' rates show since a
given placement round, so that a client follows where the other clients placed an
adapter, and only that.

A replica reports each adapter's admissions per second, each weighted e^(-age / 5 s),
as of the last whole second of its clock (`GetReplicaLoadResponse.adapter_admission_rates`).
A rate remembers where an adapter ran before a move every client made together: 6 s
later its old replica still keeps e^(-6/5) of it, and a cold adapter asked for every few
seconds often has nothing yet on its new one, so a client reading the rates as they
stand took it back, every client alike, and split it again. Two readings tell apart
what came between them: the later, less the earlier decayed over the time between, is
the weight of the admissions in between alone. A client compares those since it placed
an adapter, and follows only where there are enough of them to say anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LEAST_ADMISSIONS", "MOSTLY", "RATE_TIME_CONSTANT_S", "Reading", "RecentAdmissions"]

# The time constant of the replicas' rates, as `GetReplicaLoadResponse` documents it.
RATE_TIME_CONSTANT_S = 5.0
# Admissions of an adapter over the fleet since a round, each weighted by its age, below
# which they say nothing of where it runs: one request (weighted at most 1). A request
# or two still reach its old replica after every client moved it (routed in the moment
# between the round's start and the new placement, or sent again after a failure).
LEAST_ADMISSIONS = 1.0
# The share of an adapter's admissions on one replica past which it runs there,
# wherever this client placed it: more than half, so that two clients that placed it
# apart converge on one replica as soon as either holds the larger part.
MOSTLY = 1 / 2


@dataclass(frozen=True, slots=True)
class Reading:
    """The replicas' rates as one placement round read them."""

    # (adapter, replica address) -> admissions per second.
    rates: Mapping[tuple[str, str], float]
    # Replica address -> the wall-clock second its rates are as of.
    as_of: Mapping[str, float]
    # Replica address -> the process that answered there (its replica id): another
    # process's rates started afresh, and are never told apart from this one's.
    incarnation: Mapping[str, str]


class RecentAdmissions:
    """The last `rounds_kept` rounds' readings: their rates averaged, and the
    admissions since any of them."""

    def __init__(self, rounds_kept: int) -> None:
        self._kept = rounds_kept
        self._readings: dict[int, Reading] = {}

    def record(self, round_: int, reading: Reading) -> None:
        """Keeps `reading` as round `round_`'s, the latest: those of later rounds (the wall
        clock stepped back) and those too old are forgotten."""
        for old in [r for r in self._readings if r >= round_ or r < round_ - self._kept]:
            del self._readings[old]
        self._readings[round_] = reading

    def mean_rates(self, rounds: int) -> dict[tuple[str, str], float]:
        """Each rate averaged over the readings kept of the last `rounds` rounds (one
        missing from a reading counting as zero: under what a replica still reports);
        empty before the first reading."""
        if not self._readings:
            return {}
        latest = max(self._readings)
        window = [r for round_, r in self._readings.items() if round_ > latest - rounds]
        mean: dict[tuple[str, str], float] = {}
        for reading in window:
            for key, rate in reading.rates.items():
                mean[key] = mean.get(key, 0.0) + rate / len(window)
        return mean

    def runs_mostly(self, since: Mapping[str, int | None], up: set[str]) -> dict[str, str]:
        """Adapter -> the replica up that holds more than MOSTLY of its admissions since
        round `since[adapter]`, for those with more than LEAST_ADMISSIONS over the
        fleet; with `since[adapter]` None (not placed yet), of all the rates remember,
        however few: where its first request ran (as a proxy's own hash sent it) beats
        a first choice of its own, which would split it. Each replica counts from its
        first reading kept at or after that round (`_baseline`): less evidence, never
        older."""
        if not self._readings:
            return {}
        latest = self._readings[max(self._readings)]
        baselines: dict[tuple[int | None, str], Reading | None] = {}
        shares: dict[str, dict[str, float]] = {adapter: {} for adapter in since}
        for (adapter, address), rate in latest.rates.items():
            if adapter not in since:
                continue
            key = (since[adapter], address)
            if key not in baselines:
                baselines[key] = self._baseline(since[adapter], address, latest)
            weight = _admitted(latest, baselines[key], adapter, address, rate)
            if weight > 0:
                shares[adapter][address] = weight
        runs: dict[str, str] = {}
        for adapter, by_replica in shares.items():
            total = sum(by_replica.values())
            if total <= (0.0 if since[adapter] is None else LEAST_ADMISSIONS):
                continue
            address, most = max(by_replica.items(), key=lambda item: (item[1], item[0]))
            if most > MOSTLY * total and address in up:
                runs[adapter] = address
        return runs

    def _baseline(self, round_: int | None, address: str, latest: Reading) -> Reading | None:
        """The first reading kept from round `round_` on that holds the process answering
        at `address` now. What it remembers is subtracted: a replica down at that round,
        restarted or joined since, counts only what came after it was read again. None
        (all the rates remember) for no round, or one after the latest (the wall clock
        stepped back)."""
        if round_ is None:
            return None
        process = latest.incarnation.get(address)
        for kept in sorted(r for r in self._readings if r >= round_):
            reading = self._readings[kept]
            if address in reading.as_of and reading.incarnation.get(address) == process:
                return reading
        return None


def _admitted(
    latest: Reading, earlier: Reading | None, adapter: str, address: str, rate: float
) -> float:
    """The admissions of `adapter` on `address` between `earlier` and `latest` (whose
    rate there is `rate`), weighted by age as the rates weigh them; `earlier` None: all
    the rate remembers."""
    then = 0.0
    if earlier is not None:
        elapsed = max(0.0, latest.as_of[address] - earlier.as_of[address])
        then = earlier.rates.get((adapter, address), 0.0)
        then *= math.exp(-elapsed / RATE_TIME_CONSTANT_S)
    return (rate - then) * RATE_TIME_CONSTANT_S
