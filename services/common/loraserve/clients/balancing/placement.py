"""Where each adapter lives: its first choice of replica, moved only as far as keeps
the fleet's load bounded, decided alike by every client from the replicas' reports.

Bounded-load hashing alone decides request by request: when an adapter's first replica
is over the bound, whichever request arrives then spills, the hot adapter's and the
cold ones' alike, and a cold adapter that shares a replica with a hot one ends up
served half here, half there. Placement decides adapter by adapter instead, from each
adapter's demand (its sequences pending across the fleet, as the replicas report them,
smoothed): the busiest adapters are placed first, each on the first replica in its own
rendezvous order that still has room under `balance_factor` times the mean, so the
hot adapter keeps its home and the cold ones that shared it move, whole, to their
next choice. An adapter that runs on a replica with room stays there. Every client
reads the same reports and smooths them alike (slowly, so placements do not shuffle as
demand wobbles), so every client places alike; an adapter without demand goes to its
first choice. The request-by-request bound
(`choice.choose`) still applies on top, for bursts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loraserve.clients.balancing.choice import MIN_BOUND, preference


def place(
    demand: Mapping[str, float],
    replicas: Sequence[str],
    balance_factor: float,
    runs_on: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Adapter -> replica for every adapter with demand, busiest first (ties by name).
    An adapter tries first the replica it `runs_on` (where most of its smoothed demand
    is, as the replicas report it), then its rendezvous order; the first with room
    takes it. A function of the reports alone, with no memory of earlier placements: a
    client's memory would be its own, and two clients that once placed an adapter
    differently would keep splitting it. Where an adapter runs is memory every client
    shares, so adapters of nearly equal demand that trade places in the busiest-first
    order do not trade replicas with it."""
    if not replicas:
        return {}
    # As the request-by-request bound, never below MIN_BOUND: at a light load nothing
    # queues, and nothing should move.
    room = max(float(MIN_BOUND), balance_factor * sum(demand.values()) / len(replicas))
    assigned = dict.fromkeys(replicas, 0.0)
    placement: dict[str, str] = {}
    for adapter in sorted(demand, key=lambda a: (-demand[a], a)):
        order = preference(adapter, replicas)
        current = (runs_on or {}).get(adapter)
        if current in assigned:
            order.remove(current)
            order.insert(0, current)
        fits = [r for r in order if assigned[r] + demand[adapter] <= room]
        chosen = fits[0] if fits else min(order, key=lambda r: assigned[r])
        assigned[chosen] += demand[adapter]
        placement[adapter] = chosen
    return placement
