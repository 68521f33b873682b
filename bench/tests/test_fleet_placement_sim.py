"""The placement simulation drives the client's own Placer."""

from __future__ import annotations

from bench.fleet import placement_sim
from loraserve.clients.balancing.placer import DEMAND_WINDOW_S


def test_demand_averaged_over_its_window_moves_fewer_adapters_at_a_steady_load() -> None:
    seeds = range(12)
    averaged = sum(placement_sim.run(s, 40, DEMAND_WINDOW_S).steady() for s in seeds)
    one_round = sum(placement_sim.run(s, 40, placement_sim.ROUND_S).steady() for s in seeds)
    assert averaged < one_round
