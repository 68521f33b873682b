"""Placement's stability under demand's noise, simulated without servers: benchmark 10's
fleet (3 replicas, 24 adapters of Zipf 1.0 demand, about 20 requests a second each held
about 2.4 s) as Poisson arrivals, each replica keeping admission rates as the replicas
do (each admission weighted e^(-age / 5 s), read every 2 s round), placed by the
client's own `Placer`. For demand averaged over one round and over `DEMAND_WINDOW_S`,
it prints the share of runs that move an adapter inside benchmark 10's window (14-24 s
after the load starts, the last arm's rates still decaying) and the adapters moved a
minute at a steady load.

    python -m bench.fleet.placement_sim [--runs N]
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from loraserve.clients.balancing import BoundedLoad, Replica, preference
from loraserve.clients.balancing import placer as placer_module
from loraserve.clients.balancing.recent import RATE_TIME_CONSTANT_S

REPLICAS = ("10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051")
ADAPTERS = tuple(f"t{i:02d}" for i in range(24))
REQUESTS_PER_S = 20.0
HOLD_S = 2.4
ROUND_S = 2.0
RAMP_S = 4.0
# Rounds (of ROUND_S) of benchmark 10's measured window, counting its requests' ends.
WINDOW_ROUNDS = range(7, 13)
STEADY_FROM_ROUND = 10
_HARMONIC = sum(1 / (i + 1) for i in range(len(ADAPTERS)))
DEMAND = {a: REQUESTS_PER_S / (i + 1) / _HARMONIC for i, a in enumerate(ADAPTERS)}


@dataclass(frozen=True)
class Moves:
    """What one simulated run moved: (round, adapter) for each move."""

    moves: tuple[tuple[int, str], ...]

    def in_window(self) -> bool:
        return any(round_ in WINDOW_ROUNDS for round_, _ in self.moves)

    def steady(self) -> int:
        return sum(1 for round_, _ in self.moves if round_ >= STEADY_FROM_ROUND)


@contextmanager
def _demand_window(seconds: float) -> Iterator[None]:
    saved = placer_module.DEMAND_WINDOW_S
    placer_module.DEMAND_WINDOW_S = seconds
    try:
        yield
    finally:
        placer_module.DEMAND_WINDOW_S = saved


def run(seed: int, rounds: int, window_s: float) -> Moves:
    """One run from the last arm's steady state (the same demand, spread evenly)."""
    rnd = random.Random(seed)
    with _demand_window(window_s):
        placer = placer_module.Placer(BoundedLoad(demand_smoothing=1))
    tau = RATE_TIME_CONSTANT_S
    weights = {(a, r): DEMAND[a] * tau / len(REPLICAS) for a in ADAPTERS for r in REPLICAS}
    placement: dict[str, str] = {}
    moves: list[tuple[int, str]] = []
    for round_ in range(1, rounds + 1):
        load = min(1.0, (round_ - 1) * ROUND_S / RAMP_S)
        for key in weights:
            weights[key] *= math.exp(-ROUND_S / tau)
        for adapter in ADAPTERS:
            where = placement.get(adapter) or preference(adapter, REPLICAS)[0]
            for _ in range(_poisson(rnd, DEMAND[adapter] * ROUND_S * load)):
                weights[adapter, where] += math.exp(-rnd.random() * ROUND_S / tau)
        placer.observe(
            {r: _replica(r, weights, placement, load, 100.0 + round_ * ROUND_S) for r in REPLICAS}
        )
        placer.place(round_)
        now = placer.placement or {}
        moves += [(round_, a) for a, r in now.items() if placement.get(a) not in (None, r)]
        placement = now
    return Moves(tuple(moves))


def _replica(
    address: str,
    weights: dict[tuple[str, str], float],
    placement: dict[str, str],
    load: float,
    at: float,
) -> Replica:
    replica = Replica(address, channel=None, stub=None)  # type: ignore[arg-type]
    replica.reports_rates, replica.replica_id, replica.rates_as_of = True, address, at
    replica.arrivals = {
        a: w / RATE_TIME_CONSTANT_S for (a, r), w in weights.items() if r == address and w > 0
    }
    # Pending sequences by Little's law, where the adapter is placed.
    replica.adapters = {
        a: max(1, round(DEMAND[a] * HOLD_S * load))
        for a in replica.arrivals
        if placement.get(a, address) == address
    }
    return replica


def _poisson(rnd: random.Random, mean: float) -> int:
    limit, count, product = math.exp(-mean), 0, rnd.random()
    while product > limit:
        count += 1
        product *= rnd.random()
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    runs = parser.parse_args().runs
    for window_s in (ROUND_S, placer_module.DEMAND_WINDOW_S):
        short = [run(seed, max(WINDOW_ROUNDS) + 1, window_s) for seed in range(runs)]
        long = [run(seed, 60, window_s) for seed in range(runs // 4 or 1)]
        in_window = sum(m.in_window() for m in short) / len(short)
        steady_minutes = len(long) * (60 - STEADY_FROM_ROUND) * ROUND_S / 60
        per_minute = sum(m.steady() for m in long) / steady_minutes
        print(
            f"demand over {window_s:g} s: runs moving an adapter in the window "
            f"{in_window:.1%}; adapters moved a minute at a steady load {per_minute:.2f}"
        )


if __name__ == "__main__":
    main()
