"""Spreading a client's requests over several inference replicas: adapter affinity with
bounded loads, from what the replicas report of their load and residency."""

from loraserve.clients.balancing.choice import Candidate, choose, load_bound, preference
from loraserve.clients.balancing.placement import place, replica_room
from loraserve.clients.balancing.policy import DEFAULT_BALANCE_FACTOR, RING_HASH, BoundedLoad
from loraserve.clients.balancing.replicas import Replica, ReplicaSet

__all__ = [
    "DEFAULT_BALANCE_FACTOR",
    "RING_HASH",
    "BoundedLoad",
    "Candidate",
    "Replica",
    "ReplicaSet",
    "choose",
    "load_bound",
    "place",
    "preference",
    "replica_room",
]
