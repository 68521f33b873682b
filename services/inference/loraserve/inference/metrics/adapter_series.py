"""Which adapters have Prometheus series of their own: the top K by recent traffic.

A replica routes thousands of adapters; a series per adapter and label set would make
every scrape, and every dashboard query over the fleet, as large as the catalogue. So
the per-adapter counters name at most K adapters (`--metrics-top-adapters`) and count
every other one under `_other`. Names that start with "_" (`_base`, `_unresolved`,
`_other`) are no adapter's (adapter names start with a letter or digit) and always
have their own series; the bound is K adapters plus those.

Ranking: an adapter's score is its finished requests, halved at every re-rank, so it
weighs the last few minutes, the latest most. While fewer than K adapters have
series, an adapter takes one at its first count. Every RERANK_INTERVAL_S, checked as
requests finish (no traffic, nothing to re-rank), the K highest scores keep or get
series (one that has a series keeps it over an equal score) and the others lose theirs.

No series goes down: nothing moves between series. What an adapter did under
`_other` stays there, and it counts under its own name from its rise on. An adapter
that falls out has its series removed and their values kept here; when it rises
again, they resume from those values. The cost is a few floats per adapter that ever
fell out, for the life of the process.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import Counter

log = logging.getLogger(__name__)

OTHER = "_other"
RERANK_INTERVAL_S = 60.0
# A score halved this low (about ten quiet intervals after one request) is dropped.
_FORGOTTEN_SCORE = 1e-3

_Kept = list[tuple[Counter, tuple[str, ...], float]]


class TopAdapters:
    """Labels adapters for the counters it tracks (`track`): their own name while in
    the top `top` by traffic, `_other` otherwise."""

    def __init__(
        self,
        top: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        interval_s: float = RERANK_INTERVAL_S,
    ) -> None:
        self.top = top
        self._clock = clock
        self._interval_s = interval_s
        self._next_rank = clock() + interval_s
        self._owned: set[str] = set()
        # Requests since the last re-rank, and the decayed scores up to it.
        self._recent: dict[str, int] = {}
        self._scores: dict[str, float] = {}
        self._counters: list[tuple[Counter, tuple[str, ...]]] = []
        self._kept: dict[str, _Kept] = {}

    def track(self, counter: Counter, labelnames: Iterable[str]) -> None:
        """Follows `counter`, whose `labelnames` start with "adapter", in the ranking."""
        self._counters.append((counter, tuple(labelnames)))

    def label(self, adapter: str) -> str:
        """The adapter label to count `adapter` under now."""
        if adapter in self._owned or adapter.startswith("_"):
            return adapter
        if len(self._owned) < self.top:
            self._own(adapter)
            return adapter
        return OTHER

    def finished(self, adapter: str) -> None:
        """Counts one request of `adapter` toward its rank; re-ranks when one is due."""
        if not adapter.startswith("_"):
            self._recent[adapter] = self._recent.get(adapter, 0) + 1
        now = self._clock()
        if now >= self._next_rank:
            self._next_rank = now + self._interval_s
            self._rerank()

    def _rerank(self) -> None:
        scores = self._scores
        for name in scores:
            scores[name] /= 2
        for name, count in self._recent.items():
            scores[name] = scores.get(name, 0.0) + count
        self._recent.clear()
        for name in [n for n, score in scores.items() if score < _FORGOTTEN_SCORE]:
            del scores[name]
        owned = self._owned
        top = set(
            heapq.nlargest(
                self.top,
                owned | scores.keys(),
                key=lambda n: (scores.get(n, 0.0), n in owned, n),
            )
        )
        fallen, risen = owned - top, top - owned
        self._drop(fallen)
        for name in risen:
            self._own(name)
        if fallen or risen:
            log.debug("metrics.reranked risen=%d fallen=%d", len(risen), len(fallen))

    def _own(self, adapter: str) -> None:
        self._owned.add(adapter)
        for counter, labels, value in self._kept.pop(adapter, ()):
            counter.labels(*labels).inc(value)

    def _drop(self, adapters: set[str]) -> None:
        """Removes the series of `adapters`, keeping their values for a later rise."""
        if not adapters:
            return
        self._owned -= adapters
        for counter, labelnames in self._counters:
            for family in counter.collect():
                for sample in family.samples:
                    adapter = sample.labels["adapter"]
                    if adapter in adapters and sample.name.endswith("_total"):
                        labels = tuple(sample.labels[n] for n in labelnames)
                        self._kept.setdefault(adapter, []).append((counter, labels, sample.value))
                        counter.remove(*labels)
