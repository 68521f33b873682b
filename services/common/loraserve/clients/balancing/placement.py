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
next choice. An adapter stays where it was placed while that replica has room, and
one without demand for now keeps its place, so placements do not shuffle as demand
wobbles. Every client reads the same reports, so every client places alike; the
request-by-request bound (`choice.choose`) still applies on top, for bursts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loraserve.clients.balancing.choice import preference

# Adapters without demand keep their last place (while it stands) up to this many, so
# a cold adapter's next request goes where its last ones went.
MAX_REMEMBERED = 4096


def place(
    demand: Mapping[str, float],
    replicas: Sequence[str],
    balance_factor: float,
    previous: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Adapter -> replica for every adapter with demand, busiest first (ties by name):
    its `previous` place while that still has room, else the first replica in its order
    that has; adapters of `previous` without demand stay where they were."""
    if not replicas:
        return {}
    previous = previous or {}
    room = balance_factor * sum(demand.values()) / len(replicas)
    assigned = dict.fromkeys(replicas, 0.0)
    placement: dict[str, str] = {}
    for adapter in sorted(demand, key=lambda a: (-demand[a], a)):
        order = preference(adapter, replicas)
        if previous.get(adapter) in assigned:
            order = [previous[adapter], *(r for r in order if r != previous[adapter])]
        fits = [r for r in order if assigned[r] + demand[adapter] <= room]
        chosen = fits[0] if fits else min(order, key=lambda r: assigned[r])
        assigned[chosen] += demand[adapter]
        placement[adapter] = chosen
    for adapter, replica in previous.items():
        if len(placement) >= MAX_REMEMBERED:
            break
        if adapter not in placement and replica in assigned:
            placement[adapter] = replica
    return placement
