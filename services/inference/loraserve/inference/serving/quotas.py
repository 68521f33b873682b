"""Per-adapter quotas at admission: sequences in flight, tokens (prompt and generated)
per second and per minute, counted on this replica.

What a request costs is what the engine does for it: its `n` sequences count against
max_in_flight (one request of n=128 fills the engine as 128 requests do; one of more
sequences than the limit could never be admitted, so it is INVALID_ARGUMENT, not a
throttle to retry), and its prompt tokens are charged as well as the tokens it
generates (a prefill of a long prompt is work as decoding is, so `max_tokens=1` over
long prompts is no way around a token quota). The prompt is charged once, as OpenAI's
usage counts it: the engine's prefix cache shares one prefill among the n sequences.

A request is admitted only while its adapter is under every limit; otherwise it is
refused with RESOURCE_EXHAUSTED and a retry-after (gRPC trailing metadata, HTTP 429's
Retry-After). Tokens are charged as the request enters the engine (its prompt) and as
it streams, so a request already running always finishes: a long one can take the
buckets below zero, and the adapter's next requests wait until they have refilled.
The limits come from the store's quota records (sync calls `set_quota` and
`replace_quotas`), the same on every replica; each replica counts only its own
requests.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from loraserve.common.errors import InvalidArgument, QuotaExceeded
from loraserve.common.quota import Quota

# The name of the default quota, as the store's events and listings say it.
DEFAULT_QUOTA = ""

# An in-flight limit frees when one of the adapter's requests ends; no rate says when.
_IN_FLIGHT_RETRY_S = 1.0


class ThrottleObserver(Protocol):
    """Counts refused requests (`InferenceMetrics`)."""

    def request_throttled(self, adapter: str, limit: str) -> None: ...


@dataclass
class _Bucket:
    """Tokens that refill at `rate` per second up to `capacity`; may go below zero."""

    capacity: float
    rate: float
    level: float
    updated: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate)
        self.updated = now

    def wait_s(self) -> float:
        """Seconds until the level is above zero again."""
        return 0.0 if self.level > 0 else (1e-3 - self.level) / self.rate


@dataclass
class _Usage:
    # Sequences, a request counting its n.
    in_flight: int = 0
    buckets: dict[str, _Bucket] = field(default_factory=dict)


class QuotaGate:
    """Each adapter's quota and what it has used of it on this replica."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        observer: ThrottleObserver | None = None,
    ) -> None:
        self._clock = clock
        self._observer = observer
        self._quotas: dict[str, Quota] = {}
        self._usage: dict[str, _Usage] = {}

    def set_quota(self, name: str, quota: Quota | None) -> None:
        """Sets (None: clears) the quota of `name`, or the default (DEFAULT_QUOTA).
        Usage so far is kept; buckets are resized to the new rates."""
        if quota is None:
            self._quotas.pop(name, None)
        else:
            self._quotas[name] = quota
        for adapter, usage in self._usage.items():
            if name in (adapter, DEFAULT_QUOTA):
                self._resize(usage, self.quota_of(adapter))

    def replace_quotas(self, default: Quota | None, own: dict[str, Quota]) -> None:
        """Every quota at once, as a listing of the store has them."""
        self._quotas = dict(own)
        if default is not None:
            self._quotas[DEFAULT_QUOTA] = default
        for adapter, usage in self._usage.items():
            self._resize(usage, self.quota_of(adapter))

    def quota_of(self, name: str) -> Quota | None:
        """The quota `name` follows: its own, else the default; None is no limit."""
        return self._quotas.get(name) or self._quotas.get(DEFAULT_QUOTA)

    def in_flight(self, label: str) -> int:
        """Sequences counted under `label` running now (while it has a quota)."""
        usage = self._usage.get(label)
        return usage.in_flight if usage is not None else 0

    @contextmanager
    def admit(self, name: str, label: str, sequences: int = 1) -> Iterator[Callable[[int], None]]:
        """Holds `sequences` (a request's n) of `name`'s in flight; yields the function
        that charges tokens. Raises QuotaExceeded (counted under `label`) when a limit
        is reached, InvalidArgument when `sequences` is over max_in_flight. Usage is
        kept under `label`: the name when it is routed here, one shared label for names
        that are not (they are NOT_FOUND next), so names a client makes up cannot grow
        this table."""
        quota = self.quota_of(name)
        if quota is None:
            yield no_charge
            return
        usage = self._usage_of(label, quota)
        self._check(name, label, quota, usage, sequences)
        usage.in_flight += sequences
        try:
            yield lambda tokens: self._charge(usage, tokens)
        finally:
            usage.in_flight -= sequences

    def _check(self, name: str, label: str, quota: Quota, usage: _Usage, sequences: int) -> None:
        most = quota.max_in_flight
        if most is not None and sequences > most:
            self._count(label, "in_flight")
            raise InvalidArgument(
                f"sampling.n={sequences} is over the quota of adapter {name!r} on this "
                f"replica: at most {most} sequences in flight (max_in_flight); ask for "
                f"n <= {most}"
            )
        if most is not None and usage.in_flight + sequences > most:
            self._refuse(
                label,
                "in_flight",
                f"adapter {name!r} has {usage.in_flight} sequences in flight and this "
                f"request needs {sequences}: its quota's limit on this replica is {most}; "
                "retry later",
                _IN_FLIGHT_RETRY_S,
            )
        now = self._clock()
        for limit, bucket in usage.buckets.items():
            bucket.refill(now)
            wait = bucket.wait_s()
            if wait > 0:
                self._refuse(
                    label,
                    limit,
                    f"adapter {name!r} used its quota of tokens "
                    f"({limit.replace('_', ' ')}) on this replica; retry in {math.ceil(wait)} s",
                    wait,
                )

    def _refuse(self, label: str, limit: str, message: str, retry_after_s: float) -> None:
        self._count(label, limit)
        raise QuotaExceeded(message, retry_after_s)

    def _count(self, label: str, limit: str) -> None:
        if self._observer is not None:
            self._observer.request_throttled(label, limit)

    def _charge(self, usage: _Usage, tokens: int) -> None:
        if not usage.buckets:
            return
        now = self._clock()
        for bucket in usage.buckets.values():
            bucket.refill(now)
            bucket.level -= tokens

    def _usage_of(self, name: str, quota: Quota | None) -> _Usage:
        usage = self._usage.get(name)
        if usage is None:
            usage = self._usage[name] = _Usage()
            self._resize(usage, quota)
        return usage

    def _resize(self, usage: _Usage, quota: Quota | None) -> None:
        now = self._clock()
        per_s = quota.tokens_per_second if quota is not None else None
        per_min = quota.tokens_per_minute if quota is not None else None
        rates = {
            "tokens_per_second": (per_s, per_s),
            "tokens_per_minute": (per_min, per_min / 60 if per_min else None),
        }
        for limit, (capacity, rate) in rates.items():
            if capacity is None or rate is None:
                usage.buckets.pop(limit, None)
                continue
            bucket = usage.buckets.get(limit)
            if bucket is None:
                usage.buckets[limit] = _Bucket(capacity, rate, capacity, now)
            else:
                bucket.refill(now)
                bucket.capacity, bucket.rate = capacity, rate
                bucket.level = min(bucket.level, capacity)


def no_charge(tokens: int) -> None:
    """Charges nothing: the adapter has no token limit."""
