"""Bounded-load rendezvous choice (`loraserve.clients.balancing.choice`), as pure logic."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from loraserve.clients.balancing import BoundedLoad, Candidate, choose, load_bound, preference
from loraserve.clients.balancing.placement import place
from loraserve.common.errors import InvalidArgument

REPLICAS = ["10.0.0.1:50051", "10.0.0.2:50051", "10.0.0.3:50051"]
KEYS = [f"adapter-{i}" for i in range(200)]


def test_every_client_orders_the_replicas_alike_for_one_adapter() -> None:
    assert preference("alpha", REPLICAS) == preference("alpha", list(reversed(REPLICAS)))


def test_the_adapters_first_choices_spread_over_the_replicas() -> None:
    homes = {preference(key, REPLICAS)[0] for key in KEYS}
    assert homes == set(REPLICAS)


def test_a_replica_leaving_moves_only_the_adapters_whose_first_choice_it_was() -> None:
    before = {key: preference(key, REPLICAS)[0] for key in KEYS}
    after = {key: preference(key, REPLICAS[:2])[0] for key in KEYS}
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == REPLICAS[2]}


def test_the_least_loaded_replica_is_always_within_the_bound() -> None:
    for loads in ([0, 0, 0], [9, 0, 0], [5, 5, 5], [100, 3, 7], [1, 2, 3]):
        assert min(loads) + 1 <= load_bound(loads, 1.0)


def test_an_adapter_goes_to_its_first_replica_while_that_is_within_the_bound() -> None:
    home = preference("alpha", REPLICAS)[0]
    loads = {a: 4 for a in REPLICAS}
    candidates = {a: Candidate(a, loads[a]) for a in REPLICAS}
    assert choose("alpha", candidates, 1.25) == home


def test_an_adapter_spills_to_its_second_replica_when_the_first_is_over_the_bound() -> None:
    first, second, _ = preference("alpha", REPLICAS)
    loads = {first: 12, second: 2}
    candidates = {a: Candidate(a, loads.get(a, 2)) for a in REPLICAS}
    assert choose("alpha", candidates, 1.25) == second


def test_a_replica_holding_the_adapter_comes_first_within_the_bound() -> None:
    second = preference("alpha", REPLICAS)[1]
    candidates = {a: Candidate(a, 3) for a in REPLICAS}
    candidates[second] = Candidate(second, 3, frozenset({"alpha"}))
    assert choose("alpha", candidates, 1.25) == second


def test_a_replica_holding_the_adapter_over_the_bound_is_passed_over() -> None:
    first, second, _ = preference("alpha", REPLICAS)
    candidates = {a: Candidate(a, 2) for a in REPLICAS}
    candidates[second] = Candidate(second, 20, frozenset({"alpha"}))
    assert choose("alpha", candidates, 1.25) == first


def test_without_a_bound_a_factor_of_many_keeps_every_request_home() -> None:
    first = preference("alpha", REPLICAS)[0]
    candidates = {a: Candidate(a, 0) for a in REPLICAS}
    candidates[first] = Candidate(first, 50)
    assert choose("alpha", candidates, 1000.0) == first


@pytest.mark.parametrize("factor", [0.5, 0.99, float("nan")])
def test_a_balance_factor_below_one_is_refused(factor: float) -> None:
    with pytest.raises(InvalidArgument, match="balance_factor must be at least 1"):
        BoundedLoad(balance_factor=factor)


def test_placement_keeps_the_busiest_adapter_on_its_first_replica() -> None:
    demand = {"hot": 12.0, **{f"cold-{i}": 1.0 for i in range(20)}}
    placement = place(demand, REPLICAS, 1.25)
    assert placement["hot"] == preference("hot", REPLICAS)[0]


def test_placement_moves_a_cold_adapter_whole_off_a_full_replica() -> None:
    demand = {"hot": 12.0, **{f"cold-{i}": 1.0 for i in range(20)}}
    placement = place(demand, REPLICAS, 1.25)
    room = 1.25 * sum(demand.values()) / len(REPLICAS)
    loads = {r: sum(d for a, d in demand.items() if placement[a] == r) for r in REPLICAS}
    assert max(loads.values()) <= room, loads
    moved = [a for a in demand if placement[a] != preference(a, REPLICAS)[0]]
    assert moved, "nothing had to move: the test's demand is too even"


def test_every_client_places_alike_from_the_same_demand() -> None:
    demand = {f"adapter-{i}": 24 / (i + 1) for i in range(24)}
    assert place(demand, REPLICAS, 1.25) == place(dict(reversed(demand.items())), REPLICAS, 1.25)


def test_a_placed_adapter_goes_to_its_place_while_that_is_within_the_bound() -> None:
    home, _, elsewhere = preference("alpha", REPLICAS)
    candidates = {
        a: Candidate(a, 3, frozenset({"alpha"}) if a == home else frozenset()) for a in REPLICAS
    }
    assert choose("alpha", candidates, 1.25, first=elsewhere) == elsewhere


def test_a_placed_adapter_leaves_its_place_when_that_is_over_the_bound() -> None:
    home, _, elsewhere = preference("alpha", REPLICAS)
    candidates = {a: Candidate(a, 30 if a == elsewhere else 2) for a in REPLICAS}
    assert choose("alpha", candidates, 1.25, first=elsewhere) == home


def test_placement_moves_nothing_at_a_light_load() -> None:
    demand = {f"adapter-{i}": 1.0 for i in range(6)}
    placement = place(demand, REPLICAS, 1.25)
    assert placement == {a: preference(a, REPLICAS)[0] for a in demand}


def test_an_adapter_stays_on_the_replica_it_runs_on_while_that_has_room() -> None:
    demand = {f"adapter-{i}": 2.0 for i in range(6)}
    _, second, _ = preference("adapter-0", REPLICAS)
    placement = place(demand, REPLICAS, 1.25, runs_on={"adapter-0": second})
    assert placement["adapter-0"] == second


def test_an_adapter_stays_on_the_replica_it_runs_on_a_little_past_its_room() -> None:
    # Room: 1.25 x 15 / 3 = 6.25. "b-r" would put its replica at 7, past the room, and
    # fits on the other replica (at 6): with the room alone it would move; 6 is not far
    # lighter than 7, so it stays.
    r, x, y = REPLICAS
    demand = {"y": 5.0, "r-big": 4.0, "a-x": 3.0, "b-r": 3.0}
    runs_on = {"y": y, "r-big": r, "a-x": x, "b-r": r}
    assert place(demand, REPLICAS, 1.25, runs_on=runs_on) == runs_on


def test_a_replica_that_rejoined_empty_takes_adapters_from_the_one_they_all_run_on() -> None:
    demand = {f"adapter-{i}": 1.0 for i in range(10)}
    first, second = REPLICAS[:2]
    placement = place(demand, [first, second], 1.25, runs_on=dict.fromkeys(demand, first))
    loads = Counter(placement.values())
    # Once giving, down to the target: max(4, 1.125 x 10 / 2) = 5.625.
    assert (loads[first], loads[second]) == (5, 5), loads


def test_a_replica_that_starts_giving_gives_down_to_midway_between_mean_and_room() -> None:
    a, b, c = REPLICAS
    colds = {f"cold-{i:02d}": 1.0 for i in range(33)}
    runs_on = {"hot": a, **{n: (a, b, c)[i % 3] if i >= 9 else a for i, n in enumerate(colds)}}
    demand = {"hot": 12.0, **colds}
    placement = place(demand, REPLICAS, 1.25, runs_on=runs_on)
    loads = {r: sum(d for n, d in demand.items() if placement[n] == r) for r in REPLICAS}
    # 45 in all: a holds 12 + 9 + 8 = 29 against 8 each, far heavier; it gives, past the
    # far-lighter mark (1.6 times), down to 1.125 x 15.
    assert loads[a] <= 1.125 * 15 < 29 / 1.6 + 1, loads
    assert placement["hot"] == a


def test_an_adapter_leaves_the_replica_it_runs_on_when_that_is_well_past_its_room() -> None:
    demand = {"hot": 20.0, "cold": 1.0, **{f"other-{i}": 1.0 for i in range(8)}}
    home = place(demand, REPLICAS, 1.25)["hot"]
    placement = place(demand, REPLICAS, 1.25, runs_on={"hot": home, "cold": home})
    assert placement["hot"] == home
    assert placement["cold"] != home


def test_placement_moves_nothing_as_demand_wobbles_around_the_room() -> None:
    zipf = {f"adapter-{i:02d}": 48 / (i + 1) / 3.776 for i in range(24)}
    placed = place(zipf, REPLICAS, 1.25)
    rng = random.Random(1)
    for _ in range(100):
        wobbled = {a: d * rng.uniform(0.85, 1.15) for a, d in zipf.items()}
        assert place(wobbled, REPLICAS, 1.25, runs_on=placed) == placed


def test_new_adapters_fill_the_replicas_only_to_the_fleets_mean() -> None:
    zipf = {f"adapter-{i:02d}": 48 / (i + 1) / 3.776 for i in range(24)}
    placement = place(zipf, REPLICAS, 1.25)
    loads = {r: sum(d for a, d in zipf.items() if placement[a] == r) for r in REPLICAS}
    mean = sum(zipf.values()) / len(REPLICAS)
    assert max(loads.values()) <= mean * 1.05, loads


@pytest.mark.parametrize("seed", range(20))
def test_a_placement_from_scratch_holds_still_as_demand_wobbles(seed: int) -> None:
    # Replicas named afresh each seed, as a fleet's addresses are.
    rng = random.Random(seed)
    replicas = [f"10.0.{rng.randrange(256)}.{rng.randrange(256)}:50051" for _ in range(3)]
    zipf = {f"adapter-{i:02d}": 48 / (i + 1) / 3.776 for i in range(24)}
    placed = place({a: d * rng.uniform(0.9, 1.1) for a, d in zipf.items()}, replicas, 1.25)
    for _ in range(30):
        wobbled = {a: d * rng.uniform(0.9, 1.1) for a, d in zipf.items()}
        assert place(wobbled, replicas, 1.25, runs_on=placed) == placed


def test_a_cold_adapter_joining_an_evenly_loaded_fleet_goes_to_its_first_replica() -> None:
    home, _, lightest = preference("cold", REPLICAS)
    placed = {f"adapter-{i}": REPLICAS[i % 3] for i in range(12)}
    demand = {**dict.fromkeys(placed, 2.0), "cold": 1.0}
    # Every replica near the mean (8), home a hair above it: the cold one fits under
    # the mean nowhere, and goes where the room lets it, home, not to the replica that
    # reads lightest by a hair.
    demand[next(a for a, r in placed.items() if r == home)] = 2.2
    demand[next(a for a, r in placed.items() if r == lightest)] = 1.8
    placement = place(demand, REPLICAS, 1.25, runs_on=placed)
    assert placement["cold"] == home
