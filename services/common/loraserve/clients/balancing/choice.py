"""Which replica a request goes to: bounded-load rendezvous hashing, as pure functions.

Every adapter has its own order of the replicas (rendezvous, or highest-random-weight,
hashing: the replica with the largest hash of adapter and replica first), so each
adapter has a home, and a replica that joins or leaves moves only the adapters whose
first choice it is or becomes. A request goes to the first replica in that order whose
load, counting the request, is within `balance_factor` times the fleet's mean
(consistent hashing with bounded loads: Mirrokni, Thorup and Zadimoghaddam, 2016; the
same rule as HAProxy's and Envoy's `hash-balance-factor`). A hot adapter therefore
spills to its second replica instead of queueing behind itself, and every adapter below
one replica's share of the fleet stays on its first. Among the replicas within the
bound, one that already holds the adapter in its engine comes first: it starts the
request without a load.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replica as the choice sees it."""

    address: str
    # Sequences it runs or holds now, as last reported plus what this client started
    # and finished there since.
    load: int
    # Adapter names whose current revision is in its engine.
    resident: frozenset[str] = frozenset()


def preference(key: str, addresses: Iterable[str]) -> list[str]:
    """`addresses` in `key`'s rendezvous order: the same for every client process."""
    return sorted(addresses, key=lambda address: _weight(key, address), reverse=True)


def _weight(key: str, address: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{address}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


# A replica holding fewer sequences than this takes its adapters whatever the mean: a few
# requests queue behind nothing, and spilling them would only cost each a cold replica.
MIN_BOUND = 4


def load_bound(loads: Sequence[int], balance_factor: float) -> int:
    """The most sequences one replica may hold once this request is placed: the
    factor times the mean load counting the request, rounded up (so at least the least
    loaded replica is always within it), and never below MIN_BOUND."""
    mean = (sum(loads) + 1) / len(loads)
    return max(MIN_BOUND, math.ceil(balance_factor * mean))


# A placed adapter keeps its place up to this many times the bound: placement already
# keeps each replica's average within the bound, so what passes it is a burst, and a
# burst split over replicas would cost the adapter its warm replica for nothing.
PLACED_SLACK = 1.6


def choose(
    key: str,
    candidates: Mapping[str, Candidate],
    balance_factor: float,
    first: str | None = None,
) -> str:
    """The replica for a request of `key` (an adapter name, or the base model's key).
    `first` is where the adapter is placed (placement.py): taken, holding the adapter
    or not, while within PLACED_SLACK times the bound; past it, the bound decides."""
    if not candidates:
        raise ValueError("no replica to choose from")
    loads = [c.load for c in candidates.values()]
    bound = load_bound(loads, balance_factor)
    if first is not None and candidates[first].load + 1 <= load_bound(
        loads, balance_factor * PLACED_SLACK
    ):
        return first
    within = [
        address for address in preference(key, candidates) if candidates[address].load + 1 <= bound
    ]
    for address in within:
        if key in candidates[address].resident:
            return address
    return within[0]
