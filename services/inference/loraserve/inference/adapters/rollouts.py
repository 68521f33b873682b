"""Canary splits: which arm of an adapter's rollout one request goes to.

While an adapter has an active rollout, `weight` percent of its unpinned requests go
to the candidate revision. A request with a rollout key goes where the key's hash
puts it: SHA-256 of the adapter, the candidate revision and the key, read as a
fraction of 2**64, against the weight. So one key gets one revision on every
replica, raising the weight only moves keys towards the candidate, and each rollout
(each candidate) draws its own keys. A request without a key takes the next point
of a golden-ratio sequence from a random start: over any N requests the candidate
gets N x weight of them to within a few, not the swings of a coin toss. Pinned
requests (NAME@REV) never come here.

The key is never the caller's to choose unless the operator says so (`RolloutKeys`):
it is the principal of the caller's credential; a caller-supplied key (the
`x-rollout-key` gRPC metadata or HTTP header, or the OpenAI `user` field) counts only
with `--trust-rollout-key-header`, for a trusted gateway that names its end users.
A key a caller could choose would let it pick its arm and, sent from many keys, pass
for many callers in the guard's figures. Without a credential or a trusted key the
request has no key (the server's own sequence spreads it), and the caller is told
apart from others, for the guard's count of distinct callers, by its address.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from loraserve.clients.store import RolloutSplit
from loraserve.common.revisions.manifest import Revision
from loraserve.common.rpc.security import current_principal, current_role

ROLLOUT_KEY_HEADER = "x-rollout-key"
# The golden ratio's fractional part: the most evenly spread stride there is.
_STRIDE = 0.6180339887498949


@dataclass(frozen=True, slots=True)
class RolloutCaller:
    """Who one request is to a rollout."""

    # Picks the request's arm; "" spreads it by the weight.
    key: str = ""
    # Tells callers apart in the guard's count of distinct callers per arm ("": unknown).
    identity: str = ""


@dataclass(frozen=True, slots=True)
class RolloutKeys:
    """How a front derives a request's RolloutCaller (see the module docstring)."""

    # Whether a caller-supplied key picks the arm (--trust-rollout-key-header).
    trust_claimed: bool = False

    def caller(self, claimed: str, peer: str) -> RolloutCaller:
        """`claimed`: the key the request carries ("" if none); `peer`: the caller's
        address as far as the front knows it ("" if not). Reads the authenticated
        caller from `current_principal`, which the front's auth has set."""
        if self.trust_claimed and claimed:
            return RolloutCaller(claimed, claimed)
        if current_role.get() is not None:
            principal = current_principal.get()
            return RolloutCaller(principal, principal)
        return RolloutCaller("", peer)


def peer_host(peer: str) -> str:
    """The address of a gRPC peer (`ipv4:10.0.0.7:51234`, `ipv6:[::1]:5000`) without its
    port, which changes per connection; "" for none."""
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return address.rpartition(":")[0]
    return address or kind


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
