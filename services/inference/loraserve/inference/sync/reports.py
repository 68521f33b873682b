"""Telling the store what this replica routes, in batches.

Every adapter this replica holds anything of has a report (`AdapterReport`: the
revision its requests go to, each revision it routes or refused and its state) in
one of STATUS_SHARDS shards. Names whose report may have changed (sync applied
something, the registry routed, loaded, evicted or failed a revision) are looked at
again every `flush_s`; a shard that changed is sent whole, so the store's copy is
always one replica's latest word. A report goes at least every `interval_s` (the
sign of life; its shards only when they changed) and, while a rollout is active,
with the rollout counters every `counters_interval_s`. Every name is looked at again
once per `interval_s`, in case a change was not marked. A store that had let this
replica's statuses expire (`known` false), or a report that failed, gets the
shards again at the next flush; the first report of a run carries all of them,
which also clears what an earlier run left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from loraserve.clients.replicareport import StatusBatch
from loraserve.common.errors import LoraserveError
from loraserve.common.fleet.reports import AdapterReport, RevisionCounters
from loraserve.common.statusshards import STATUS_SHARDS, shard_of

log = logging.getLogger(__name__)


class StatusAPI(Protocol):
    """The store's call for statuses (`StoreClient`, or a fake)."""

    async def report_status(self, batch: StatusBatch) -> bool: ...


class Reportable(Protocol):
    """What the registry says of each name (`AdapterRegistry`, or a fake)."""

    def report(self, name: str) -> AdapterReport | None: ...

    def names(self) -> set[str]: ...


class CountersSource(Protocol):
    """The per-revision counts of adapters in a rollout (`RolloutMeter`)."""

    @property
    def epoch(self) -> str: ...

    @property
    def active(self) -> bool: ...

    def counters(self) -> list[RevisionCounters]: ...


@dataclass(frozen=True)
class ReportSettings:
    # Longest time between reports; the store shows a replica silent for twice this
    # as stale (its --status-ttl must be longer).
    interval_s: float = 60.0
    # A change is reported within about this.
    flush_s: float = 1.0
    # How often the rollout counters go while a rollout is active.
    counters_interval_s: float = 10.0


class StatusReporter:
    def __init__(
        self,
        store: StatusAPI,
        registry: Reportable,
        settings: ReportSettings,
        position: Callable[[], tuple[int, str]],
        changed: set[str],
        counters: CountersSource | None = None,
        ttft_bounds: tuple[float, ...] = (),
    ) -> None:
        self._store = store
        self._registry = registry
        self._settings = settings
        # (applied seq, store incarnation) to report.
        self._position = position
        # Names to look at again, added to by sync and the registry.
        self._changed = changed
        self._counters = counters
        self._ttft_bounds = ttft_bounds
        self._sent: list[dict[str, AdapterReport]] = [{} for _ in range(STATUS_SHARDS)]
        self._dirty = set(range(STATUS_SHARDS))
        self._next_report = 0.0
        self._next_full_look = 0.0
        self._next_counters = 0.0

    def mark(self, name: str) -> None:
        self._changed.add(name)

    async def run(self) -> None:
        """Reports until cancelled; a failure is logged and retried at the next flush."""
        while True:
            try:
                await self.flush()
            except LoraserveError as exc:
                log.warning("sync.report_failed reason=%s", exc)
            except Exception:
                # A bug here must not end the reports: the store would show this
                # replica as stale, then forget it.
                log.exception("sync.report_bug")
            await asyncio.sleep(self._settings.flush_s)

    async def flush(self) -> None:
        """Sends what changed, if anything did or a report is due."""
        now = time.monotonic()
        self._look_again(now)
        counters_due = (
            self._counters is not None and self._counters.active and now >= self._next_counters
        )
        if not self._dirty and not counters_due and now < self._next_report:
            return
        dirty = sorted(self._dirty)
        seq, incarnation = self._position()
        batch = StatusBatch(
            applied_seq=seq,
            incarnation=incarnation,
            interval_s=self._settings.interval_s,
            shards={i: tuple(self._sent[i][n] for n in sorted(self._sent[i])) for i in dirty},
        )
        if counters_due and self._counters is not None:
            batch = replace(
                batch,
                counters=tuple(self._counters.counters()),
                counters_epoch=self._counters.epoch,
                ttft_bounds=self._ttft_bounds,
            )
        self._dirty.difference_update(dirty)
        try:
            known = await self._store.report_status(batch)
        except BaseException:
            self._dirty.update(dirty)
            raise
        self._next_report = now + self._settings.interval_s
        if counters_due:
            self._next_counters = now + self._settings.counters_interval_s
        if not known:
            log.info("sync.store_forgot_replica: reporting every shard again")
            self._dirty = set(range(STATUS_SHARDS))

    def _look_again(self, now: float) -> None:
        """Takes the reports of the names marked changed (every name, once per
        interval) and marks the shards whose content changed."""
        names = set(self._changed)
        self._changed.clear()
        if now >= self._next_full_look:
            self._next_full_look = now + self._settings.interval_s
            names |= self._registry.names()
            names.update(n for shard in self._sent for n in shard)
        for name in names:
            report = self._registry.report(name)
            shard = shard_of(name)
            if self._sent[shard].get(name) == report:
                continue
            if report is None:
                del self._sent[shard][name]
            else:
                self._sent[shard][name] = report
            self._dirty.add(shard)
