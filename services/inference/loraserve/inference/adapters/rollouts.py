"""Canary splits: which arm of an adapter's rollout one request goes to.

While an adapter has an active rollout, `weight` percent of its unpinned requests go
to the candidate revision. A request with a rollout key (the `x-rollout-key` gRPC
metadata or HTTP header, or the OpenAI `user` field: a user id, say) goes where the
key's hash puts it: SHA-256 of the adapter, the candidate revision and the key,
read as a fraction of 2**64, against the weight. So one key gets one revision on
every replica, raising the weight only moves keys towards the candidate, and each
rollout (each candidate) draws its own keys. A request without a key takes the next
point of a golden-ratio sequence from a random start: over any N requests the
candidate gets N x weight of them to within a few, not the swings of a coin toss.
Pinned requests (NAME@REV) never come here.
"""

from __future__ import annotations

import hashlib
import random

from loraserve.clients.store import RolloutSplit
from loraserve.common.revisions.manifest import Revision

ROLLOUT_KEY_HEADER = "x-rollout-key"
# The golden ratio's fractional part: the most evenly spread stride there is.
_STRIDE = 0.6180339887498949


def key_fraction(name: str, candidate: int, key: str) -> float:
    """Where a rollout key falls in [0, 1): the same on every replica and version."""
    digest = hashlib.sha256(f"{name}@{candidate}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class Splits:
    """The active rollouts by adapter name, and each one's sequence for keyless requests."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._splits: dict[str, RolloutSplit] = {}
        self._points: dict[str, float] = {}

    def get(self, name: str) -> RolloutSplit | None:
        return self._splits.get(name)

    def set(self, name: str, split: RolloutSplit) -> None:
        self._splits[name] = split
        self._points.setdefault(name, self._rng.random())

    def end(self, name: str) -> RolloutSplit | None:
        self._points.pop(name, None)
        return self._splits.pop(name, None)

    def is_candidate(self, name: str, revision: int) -> bool:
        split = self._splits.get(name)
        return split is not None and split.candidate.revision == revision

    def names(self) -> list[str]:
        return list(self._splits)

    def choose_candidate(self, name: str, key: str) -> Revision | None:
        """The candidate when this request goes to it; None for the current arm."""
        split = self._splits.get(name)
        if split is None or split.weight <= 0:
            return None
        share = split.weight / 100
        if key:
            fraction = key_fraction(name, split.candidate.revision, key)
        else:
            fraction = self._points[name] = (self._points[name] + _STRIDE) % 1.0
        return split.candidate if fraction < share else None
