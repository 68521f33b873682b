"""Counts per revision of the adapters in a rollout: both arms, for Prometheus and for
the store's guards.

While an adapter has an active rollout on this replica, every request its split
routed is counted by the revision that served it (requests by code, server-side
errors, tokens and time to first token), as `loraserve_inference_rollout_*` series
labelled with the arm, so the two arms can be compared in Prometheus; and as
cumulative counters the replica reports to the store (sync's reporter), under an
epoch that names this process: a restarted replica counts from zero under a new one.
When the rollout ends its counts and series go, so their number stays bounded by the
active rollouts.

Only what the revision itself does is counted, so that no caller can steer the
figures the guards judge: a pinned request (NAME@REV) chose its revision and is not
counted; time to first token runs from the engine's submission, not admission (the
waits for admission, a fair turn or the candidate's load are not the revision's);
and each revision's most recent distinct callers are kept (hashes, with the request
count when last seen), from which the store counts each arm's callers in a window.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram

from loraserve.common.config.textlimits import MAX_ROLLOUT_CALLERS
from loraserve.common.fleet.reports import CallerSighting, RevisionCounters

TTFT_BOUNDS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# What counts against a revision: errors of the server, not a client's own mistake,
# cancel, deadline or an overloaded replica (the same for both arms).
ERROR_CODES = frozenset(
    {"INTERNAL", "UNKNOWN", "UNAVAILABLE", "DATA_LOSS", "FAILED_PRECONDITION", "ABORTED"}
)


@dataclass
class _Counts:
    requests: int = 0
    errors: int = 0
    generated: int = 0
    # Requests per TTFT bucket (not cumulative), the last one past every bound.
    buckets: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BOUNDS_S) + 1))
    # Caller hash -> `requests` after its latest request; the most recent last.
    callers: OrderedDict[int, int] = field(default_factory=OrderedDict)

    def seen(self, caller: int) -> None:
        self.callers[caller] = self.requests
        self.callers.move_to_end(caller)
        if len(self.callers) > MAX_ROLLOUT_CALLERS:
            self.callers.popitem(last=False)


def caller_hash(name: str, candidate: int, identity: str) -> int:
    """64 bits naming a caller of a rollout, alike on every replica; each rollout's
    differ, so the store cannot follow one caller across rollouts."""
    digest = hashlib.sha256(f"{name}@{candidate}\0caller\0{identity}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


class RolloutMeter:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.epoch = uuid.uuid4().hex
        self._candidates: dict[str, int] = {}
        self._counts: dict[tuple[str, int], _Counts] = {}
        # Per adapter, the label values of its series: (adapter, revision, arm) and code.
        self._series: dict[str, set[tuple[tuple[str, str, str], str]]] = {}
        labels = ["adapter", "revision", "arm"]
        self._requests = Counter(
            "loraserve_inference_rollout_requests",
            "Generate calls for an adapter in a rollout that its split routed (not pinned), "
            "by the revision that served them, its arm (current or candidate) and gRPC "
            "status code.",
            [*labels, "code"],
            registry=registry,
        )
        self._tokens = Counter(
            "loraserve_inference_rollout_generated_tokens",
            "Tokens generated for an adapter in a rollout, by revision and arm.",
            labels,
            registry=registry,
        )
        self._ttft = Histogram(
            "loraserve_inference_rollout_time_to_first_token_seconds",
            "Time to first token of an adapter in a rollout from the engine's submission "
            "(no admission, turn or load wait), by revision and arm.",
            labels,
            buckets=TTFT_BOUNDS_S,
            registry=registry,
        )

    @property
    def active(self) -> bool:
        return bool(self._candidates)

    def set(self, name: str, candidate: int) -> None:
        if self._candidates.get(name) not in (None, candidate):
            self.end(name)
        self._candidates[name] = candidate

    def end(self, name: str) -> None:
        self._candidates.pop(name, None)
        for key in [k for k in self._counts if k[0] == name]:
            del self._counts[key]
        series = self._series.pop(name, set())
        for labels, code in series:
            self._requests.remove(*labels, code)
        for labels in {labels for labels, _ in series}:
            self._tokens.remove(*labels)
            # Only requests that produced a token have a TTFT series.
            with contextlib.suppress(KeyError):
                self._ttft.remove(*labels)

    def finished(
        self,
        name: str,
        revision: int,
        code: str,
        ttft_s: float | None,
        generated: int,
        caller: str = "",
        *,
        split: bool = True,
    ) -> None:
        """Counts a request for `name` served by `revision`, if `name` is in a rollout and
        the rollout's split chose the revision (not a pinned request, `split` False).
        `ttft_s` from the engine's submission; `caller`: who called (adapters.rollouts'
        RolloutCaller.identity; "" is one unknown caller)."""
        candidate = self._candidates.get(name)
        if candidate is None or not split:
            return
        counts = self._counts.setdefault((name, revision), _Counts())
        counts.requests += 1
        counts.errors += code in ERROR_CODES
        counts.generated += generated
        counts.seen(caller_hash(name, candidate, caller))
        labels = (name, str(revision), "candidate" if revision == candidate else "current")
        self._series.setdefault(name, set()).add((labels, code))
        self._requests.labels(*labels, code).inc()
        self._tokens.labels(*labels).inc(generated)
        if ttft_s is not None:
            counts.buckets[bisect.bisect_left(TTFT_BOUNDS_S, ttft_s)] += 1
            self._ttft.labels(*labels).observe(ttft_s)

    def counters(self) -> list[RevisionCounters]:
        """Every counted revision's cumulative counts (TTFT buckets cumulative)."""
        result = []
        for (name, revision), counts in sorted(self._counts.items()):
            cumulative, total = [], 0
            for n in counts.buckets:
                total += n
                cumulative.append(total)
            result.append(
                RevisionCounters(
                    name,
                    revision,
                    counts.requests,
                    counts.errors,
                    counts.generated,
                    tuple(cumulative),
                    tuple(CallerSighting(c, n) for c, n in counts.callers.items()),
                )
            )
        return result
