"""An adapter's quota: what one inference replica admits of its requests.

The store keeps quotas in its change log (an adapter's own, on the adapter, and one
default for every adapter without its own), so every replica enforces the same limits
from the same seq; each replica counts only its own requests, so a fleet of N
replicas admits up to N times a quota (docs/design.md, "Quotas").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.errors import InvalidArgument

# Where a limit is no limit: the proto's 0, the domain's None.
_LIMITS = ("max_in_flight", "tokens_per_second", "tokens_per_minute")
# What each limit may be, both ends included. Below one sequence or one token there is
# nothing to count (and a rate near zero refills never: a retry-after past any clock);
# above these no replica comes near, and the bucket arithmetic stays exact.
LIMIT_RANGES: dict[str, tuple[int, int]] = {
    "max_in_flight": (1, 1_000_000),
    "tokens_per_second": (1, 1_000_000_000),
    "tokens_per_minute": (1, 1_000_000_000),
}


def limit_problem(name: str, value: float) -> str | None:
    """What is wrong with `value` as the limit `name` (e.g. "must be in [1, 1000000000],
    got 0.5"), None when it is in range."""
    low, high = LIMIT_RANGES[name]
    if math.isfinite(value) and low <= value <= high:
        return None
    return f"must be in [{low}, {high}], got {value:g}"


@dataclass(frozen=True, slots=True)
class Quota:
    """Limits of one adapter on one replica; None is no limit, and at least one is
    set (a quota with none is no quota: clear it instead)."""

    # Sequences of the adapter running at once (a request counts its n); a request of
    # more can never run, and is INVALID_ARGUMENT.
    max_in_flight: int | None = None
    # Tokens, prompt and generated, per second (a bucket of one second's worth,
    # refilled continuously) and per minute (one minute's worth).
    tokens_per_second: float | None = None
    tokens_per_minute: float | None = None

    def __post_init__(self) -> None:
        for name in _LIMITS:
            value = getattr(self, name)
            problem = None if value is None else limit_problem(name, value)
            if problem is not None:
                raise InvalidArgument(f"quota {name} {problem}")
        if all(getattr(self, name) is None for name in _LIMITS):
            raise InvalidArgument(
                "a quota needs at least one limit (max_in_flight, tokens_per_second, "
                "tokens_per_minute); clear the quota to lift every limit"
            )

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _LIMITS if getattr(self, name) is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Quota:
        in_flight = data.get("max_in_flight")
        per_s = data.get("tokens_per_second")
        per_min = data.get("tokens_per_minute")
        return cls(
            max_in_flight=None if in_flight is None else int(in_flight),
            tokens_per_second=None if per_s is None else float(per_s),
            tokens_per_minute=None if per_min is None else float(per_min),
        )

    def describe(self) -> str:
        """E.g. `in-flight 4, 100 tokens/s, 3000 tokens/min`."""
        parts = [
            f"in-flight {self.max_in_flight}" if self.max_in_flight else "",
            f"{self.tokens_per_second:g} tokens/s" if self.tokens_per_second else "",
            f"{self.tokens_per_minute:g} tokens/min" if self.tokens_per_minute else "",
        ]
        return ", ".join(p for p in parts if p)


def quota_to_proto(quota: Quota) -> pb.AdapterQuota:
    return pb.AdapterQuota(
        max_in_flight=quota.max_in_flight or 0,
        tokens_per_second=quota.tokens_per_second or 0.0,
        tokens_per_minute=quota.tokens_per_minute or 0.0,
    )


def quota_from_proto(message: pb.AdapterQuota) -> Quota:
    """The domain quota; a limit out of its range (LIMIT_RANGES), or none at all, is
    InvalidArgument naming it (0 is no limit)."""
    for name in _LIMITS:
        value = getattr(message, name)
        problem = limit_problem(name, value) if value else None
        if problem is not None:
            raise InvalidArgument(f"quota {name} {problem} (0: no limit)")
    return Quota(
        max_in_flight=message.max_in_flight or None,
        tokens_per_second=message.tokens_per_second or None,
        tokens_per_minute=message.tokens_per_minute or None,
    )
