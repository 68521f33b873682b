"""One client's placement round after round, from replicas' reports set by hand."""

from __future__ import annotations

import math

import pytest

from loraserve.clients.balancing import BoundedLoad, Replica, preference
from loraserve.clients.balancing.placer import Placer
from loraserve.clients.balancing.recent import RATE_TIME_CONSTANT_S
from loraserve.clients.routing import BASE_MODEL_HASH_KEY

POLICY = BoundedLoad(demand_smoothing=1)
REPLICAS = ("r1", "r2", "r3")


def _replica(address: str, rates: dict[str, float], at: float, up: bool = True) -> Replica:
    """A replica as polled at `at`, reporting `rates` (and each adapter pending once)."""
    replica = Replica(address, channel=None, stub=None)  # type: ignore[arg-type]
    replica.up, replica.reports_rates, replica.replica_id = up, True, f"{address}-process"
    replica.arrivals, replica.adapters = rates, dict.fromkeys(rates, 1)
    replica.rates_as_of = at
    return replica


def test_demand_averages_the_rates_of_the_last_rounds() -> None:
    placer = Placer(POLICY)
    for round_, (alpha, beta) in enumerate(((1.0, 3.0), (3.0, 1.0))):
        at = 100.0 + 2 * round_
        placer.observe({"r1": _replica("r1", {"alpha": alpha, "beta": beta}, at)})
        placer.place(round_)
    demand = placer.demand
    assert demand["alpha"] == pytest.approx(demand["beta"])


def test_a_replica_back_from_down_does_not_pull_back_an_adapter_placed_while_it_was_away() -> None:
    home, second, third = preference("alpha", ["r1", "r2", "r3"])
    placer = Placer(POLICY)
    placer.observe(
        {
            home: _replica(home, {}, 100.0, up=False),
            second: _replica(second, {"alpha": 1.0}, 100.0),
            third: _replica(third, {}, 100.0),
        }
    )
    placer.place(1)
    placed = placer.placement
    # Back, it still remembers admissions from before it was away; nothing came since.
    decayed = math.exp(-2 / RATE_TIME_CONSTANT_S)
    placer.observe(
        {
            home: _replica(home, {"alpha": 3.0}, 102.0),
            second: _replica(second, {"alpha": decayed}, 102.0),
            third: _replica(third, {}, 102.0),
        }
    )
    placer.place(2)
    assert (placed, placer.placement) == ({"alpha": second}, {"alpha": second})


@pytest.mark.parametrize("spilled", [True, False])
def test_a_client_follows_admissions_elsewhere_only_where_its_own_requests_were_not_spilled(
    spilled: bool,
) -> None:
    home, other, _ = preference("alpha", ["r1", "r2", "r3"])
    placer = Placer(POLICY)
    placer.observe({r: _replica(r, {"alpha": 1.0} if r == home else {}, 100.0) for r in REPLICAS})
    placer.place(1)
    placed = placer.placement
    for _ in range(5):
        placer.sent("alpha", to_placement=not spilled)
    # Admitted since on `other` alone: where this client's own requests went too (past
    # the bound), or where the other clients placed it.
    decayed = math.exp(-2 / RATE_TIME_CONSTANT_S)
    rates = {home: {"alpha": decayed}, other: {"alpha": 2.0}}
    placer.observe({r: _replica(r, rates.get(r, {}), 102.0) for r in REPLICAS})
    placer.place(2)
    assert placed == {"alpha": home}
    assert placer.placement == {"alpha": home if spilled else other}


def test_an_adapter_too_hot_for_one_replica_is_not_followed_where_most_of_it_ran() -> None:
    # Two replicas, as behind HAProxy: placed on `home` while cold, then hot past one
    # replica's room and spread by the bound (haproxy-placement leaves it unmapped),
    # most of it on `other`.
    home, other = preference("hot", ["r1", "r2"])
    placer = Placer(POLICY)
    placer.observe(
        {r: _replica(r, {"hot": 1.0} if r == home else {}, 100.0) for r in (home, other)}
    )
    placer.place(1)
    rates = {home: {"hot": 3.0, "cold": 0.1}, other: {"hot": 5.0}}
    pending = {home: {"hot": 4, "cold": 1}, other: {"hot": 6}}
    for round_, at in ((2, 102.0), (3, 104.0)):
        replicas = {r: _replica(r, rates[r], at) for r in (home, other)}
        for address, replica in replicas.items():
            replica.adapters = pending[address]
        placer.observe(replicas)
        placer.place(round_)
    placement = placer.placement
    assert placement is not None
    assert placement["hot"] == home


def test_a_round_with_no_replica_up_places_nothing() -> None:
    placer = Placer(POLICY)
    placer.observe({r: _replica(r, {}, 100.0, up=False) for r in REPLICAS})
    placer.place(1)
    assert placer.placement == {}


def _observed(
    *reports: tuple[dict[str, float], dict[str, float] | None], round_: int = 1
) -> Placer:
    """A placer that has placed round `round_` after observing one replica per report:
    its rates and its tokens per sequence (None: a release that reports none)."""
    placer = Placer(POLICY)
    _observe(placer, *reports)
    placer.place(round_)
    return placer


def _observe(placer: Placer, *reports: tuple[dict[str, float], dict[str, float] | None]) -> None:
    replicas = {}
    for i, (rates, tokens) in enumerate(reports):
        replica = _replica(f"r{i + 1}", rates, 100.0)
        replica.tokens_per_sequence = tokens or {}
        replica.reports_tokens = tokens is not None
        replicas[replica.address] = replica
    placer.observe(replicas)


def test_demand_weighs_an_adapters_admissions_by_the_tokens_its_sequences_generate() -> None:
    # 8 long streams against many short requests: the streams hold their places longer.
    demand = _observed(({"hot": 1.0, "cold": 5.0}, {"hot": 150.0, "cold": 4.0})).demand
    assert demand["hot"] / demand["cold"] == pytest.approx(150 / 20)
    # Spread over the pending sequences the replica reports (one of each).
    assert sum(demand.values()) == pytest.approx(2.0)


def test_an_adapter_no_replica_reports_tokens_for_counts_the_places_it_holds() -> None:
    # Each pending once: "new" holds 1 of the 3 places, the others share the rest by
    # their admissions x tokens (10 against 6).
    rates = {"alpha": 1.0, "beta": 3.0, "new": 1.0}
    demand = _observed((rates, {"alpha": 10, "beta": 2})).demand
    assert demand == pytest.approx({"alpha": 1.25, "beta": 0.75, "new": 1.0})


def test_an_adapter_without_tokens_on_one_replica_weighs_its_tokens_on_the_others() -> None:
    demand = _observed(
        ({"alpha": 1.0, "beta": 1.0}, {"alpha": 50.0, "beta": 2.0}),
        ({"alpha": 1.0}, {}),
    ).demand
    assert demand["alpha"] / demand["beta"] == pytest.approx(2 * 50 / 2)


def test_a_fleet_with_a_replica_reporting_no_tokens_is_placed_by_admissions_alone() -> None:
    # Weighed by the fleet's tokens, "old" would count as the long streams it shares
    # nothing with.
    demand = _observed(
        ({"hot": 1.0}, {"hot": 150.0}),
        ({"old": 3.0}, None),
    ).demand
    assert demand["old"] / demand["hot"] == pytest.approx(3.0)


def test_the_base_models_tokens_weigh_its_admissions_under_its_hash_key() -> None:
    demand = _observed(({"": 1.0, "alpha": 1.0}, {"": 30.0, "alpha": 10.0})).demand
    assert demand[BASE_MODEL_HASH_KEY] / demand["alpha"] == pytest.approx(3.0)


def test_demand_read_between_rounds_weighs_tokens_as_the_last_round_placed() -> None:
    placer = _observed(({"hot": 1.0, "cold": 1.0}, {"hot": 100.0, "cold": 1.0}))
    placed = placer.demand
    _observe(placer, ({"hot": 1.0, "cold": 1.0}, {"hot": 1.0, "cold": 100.0}))
    demand = placer.demand
    assert demand["hot"] / demand["cold"] == pytest.approx(placed["hot"] / placed["cold"])
