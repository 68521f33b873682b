"""Where each adapter lives: its first choice of replica, moved only as far as keeps
the fleet's load bounded, decided alike by every client from the replicas' reports.

Bounded-load hashing alone decides request by request: when an adapter's first replica
is over the bound, whichever request arrives then spills, the hot adapter's and the cold
ones' alike, and a cold adapter that shares a replica with a hot one ends up served half
here, half there. Placement decides adapter by adapter instead, from each adapter's
demand (how often the fleet's replicas report it admitted, smoothed, in pending
sequences: `ReplicaSet.demand`): the busiest adapters are placed first, each on the
first replica in its own rendezvous order that still has room under `balance_factor`
times the mean, so the hot adapter keeps its home and the cold ones that shared it move,
whole, to their next choice. An adapter stays on the replica it runs on until that one
is well past its room, or past it with a far lighter replica to go to. Every client
reads the same reports and smooths them alike (slowly, so placements do not shuffle as
demand wobbles), so every client places alike; where one placed an adapter elsewhere,
the reports show it running mostly where the others placed it, and it follows. An
adapter without demand goes to its first choice. The request-by-request bound
(`choice.choose`) still applies on top, for bursts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loraserve.clients.balancing.choice import MIN_BOUND, PLACED_SLACK, preference


def place(
    demand: Mapping[str, float],
    replicas: Sequence[str],
    balance_factor: float,
    runs_on: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Adapter -> replica for every adapter with demand, busiest first (ties by name).
    An adapter stays on the replica it `runs_on` (where it was placed, or where the
    replicas' reports show it mostly runs) while that replica has room for it, or is a little past
    its room with no far lighter replica to go to (`_stays`); otherwise the first
    replica in its rendezvous order with room takes it. The slack keeps demand's
    wobble from moving adapters: with the room alone, whichever adapter came last to a
    nearly full replica moved, and the next round, with demand a little different,
    another one, each move splitting an adapter for a while. A pure function: `runs_on`
    is all it remembers (`ReplicaSet` passes its own last placement, corrected by where
    the reports show an adapter mostly running, so clients that once placed an adapter
    differently converge)."""
    if not replicas:
        return {}
    room = replica_room(demand, len(replicas), balance_factor)
    assigned = dict.fromkeys(replicas, 0.0)
    # What each replica runs now, all of it: busiest first, `assigned` is only part of
    # it until the end, and a replica whose adapters come late would look light.
    running = dict.fromkeys(replicas, 0.0)
    for adapter, where in (runs_on or {}).items():
        if where in running:
            running[where] += demand.get(adapter, 0.0)
    placement: dict[str, str] = {}
    for adapter in sorted(demand, key=lambda a: (-demand[a], a)):
        wanted = demand[adapter]
        order = preference(adapter, replicas)
        fits = [r for r in order if assigned[r] + wanted <= room]
        current = (runs_on or {}).get(adapter)
        if current in assigned and _stays(assigned, running, current, wanted, room, fits):
            chosen = current
        else:
            chosen = fits[0] if fits else min(order, key=lambda r: assigned[r])
        assigned[chosen] += wanted
        placement[adapter] = chosen
    return placement


def _stays(
    assigned: Mapping[str, float],
    running: Mapping[str, float],
    current: str,
    wanted: float,
    room: float,
    fits: list[str],
) -> bool:
    """Whether an adapter stays on the replica it runs on: that replica has room for it,
    or is within PLACED_SLACK times its room and no replica with room would hold
    PLACED_SLACK times less, counting all it runs now. Demand's wobble around the room
    moves nothing then, and a replica that is far lighter (one that rejoined empty)
    still takes adapters."""
    here = assigned[current] + wanted
    if here <= room:
        return True
    lighter = any(
        (max(assigned[r], running[r]) + wanted) * PLACED_SLACK <= here for r in fits if r != current
    )
    return here <= room * PLACED_SLACK and not lighter


def replica_room(demand: Mapping[str, float], replicas: int, balance_factor: float) -> float:
    """The demand one replica may be given: `balance_factor` times the mean. As the
    request-by-request bound, never below MIN_BOUND: at a light load nothing queues,
    and nothing should move."""
    return max(float(MIN_BOUND), balance_factor * sum(demand.values()) / replicas)
