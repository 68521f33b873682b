"""The store's own check of active rollouts: figures for `GetRollout`, aborts by guard.

Every store replica runs it, and every one may decide to abort a rollout: the abort
is a commit through the change log, whose builder names the rollout by its start seq
and finds nothing to do once that rollout has ended, so one abort is committed
however many replicas decide it (docs/design.md says why no leader is elected). Each
check reads the live replicas' counters and, for rollouts that abort on a NACK, the
candidate's shard: objects read once per change (replicas/reads.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime

from loraserve.adapterstore.catalog import now
from loraserve.adapterstore.changelog import ChangeLog
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.adapterstore.rollout.changes import rollout_aborted
from loraserve.adapterstore.rollout.figures import CounterHistory, arm_figures, verdict
from loraserve.adapterstore.rollout.records import GUARD_ACTOR, ArmFigures, Rollout
from loraserve.common.config.textlimits import MAX_ERROR_MESSAGE_BYTES, truncate_text
from loraserve.common.errors import LoraserveError
from loraserve.common.fleet.reports import RevisionReport, ServingState
from loraserve.common.rpc.backoff import Backoff

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A rollout's figures as this store replica last took them."""

    start_seq: int
    arms: tuple[ArmFigures, ArmFigures]  # current, candidate
    candidate_by_replica: tuple[tuple[str, ArmFigures], ...]
    time: datetime


class RolloutGuard:
    def __init__(self, changelog: ChangeLog, statuses: ReplicaStatusStore, interval_s: float):
        self._log = changelog
        self._statuses = statuses
        self._interval_s = interval_s
        self._history = CounterHistory()
        # Adapter name -> its active rollout's latest figures.
        self.latest: dict[str, Evaluation] = {}

    def figures(self, rollout: Rollout) -> tuple[ArmFigures, ...]:
        """The rollout's latest figures (current arm first); () before the first check."""
        evaluation = self.latest.get(rollout.adapter_name)
        if evaluation is None or evaluation.start_seq != rollout.start_seq:
            return ()
        return evaluation.arms

    async def run(self) -> None:
        """Checks every `interval_s` until cancelled; a failure is logged and the
        next check comes after a backoff."""
        backoff = Backoff(self._interval_s, _MAX_BACKOFF_S)
        delay = self._interval_s
        while True:
            await asyncio.sleep(delay)
            try:
                await self.check()
            except LoraserveError as e:
                delay = backoff.next_delay()
                log.warning("rollout.check_failed retry_in_s=%.1f error=%s", delay, e.message)
            except Exception:
                delay = backoff.next_delay()
                log.exception("rollout.check_bug retry_in_s=%.1f", delay)
            else:
                backoff.reset()
                delay = self._interval_s

    async def check(self) -> None:
        """Takes every active rollout's figures, and aborts those a guard condemns."""
        active = [a.rollout for a in self._log.state.adapters.values() if a.active_rollout]
        rollouts = [r for r in active if r is not None]
        self.latest = {
            k: v for k, v in self.latest.items() if k in {r.adapter_name for r in rollouts}
        }
        if not rollouts:
            self._history = CounterHistory()
            return
        taken = time.monotonic()
        keep_s = 2 * max(r.guards.window_s for r in rollouts)
        self._history.record(taken, await self._statuses.reader.counters(), keep_s)
        for rollout in rollouts:
            evaluation = self._evaluate(rollout, taken)
            self.latest[rollout.adapter_name] = evaluation
            nacks = (
                await self.nacks(rollout.adapter_name, rollout.candidate_revision)
                if rollout.guards.abort_on_nack
                else []
            )
            reason = verdict(rollout, *evaluation.arms, nacks)
            if reason:
                await self._abort(rollout, reason, evaluation.arms)

    def _evaluate(self, rollout: Rollout, taken: float) -> Evaluation:
        name, window = rollout.adapter_name, rollout.guards.window_s
        current = self._history.deltas(name, rollout.current_revision, window, taken)
        candidate = self._history.deltas(name, rollout.candidate_revision, window, taken)
        arms = (
            arm_figures(rollout.current_revision, list(current.values())),
            arm_figures(rollout.candidate_revision, list(candidate.values())),
        )
        by_replica = tuple(
            (replica, arm_figures(rollout.candidate_revision, [delta]))
            for replica, delta in sorted(candidate.items())
        )
        return Evaluation(rollout.start_seq, arms, by_replica, now())

    async def nacks(self, name: str, revision: int) -> list[tuple[str, RevisionReport]]:
        """Live replicas that refused `name`@`revision`, with what each reported."""
        refused = []
        for status in await self._statuses.reader.adapter(name):
            report = status.report.revision(revision) if status.report else None
            if report is not None and report.state is ServingState.FAILED:
                refused.append((status.replica_id, report))
        return refused

    async def _abort(self, rollout: Rollout, reason: str, figures: tuple[ArmFigures, ...]) -> None:
        reason = truncate_text(reason, MAX_ERROR_MESSAGE_BYTES)
        build = rollout_aborted(
            rollout.adapter_name, reason, figures, GUARD_ACTOR, start_seq=rollout.start_seq
        )
        change = await self._log.commit(build)
        if change is None:
            log.info(
                "rollout.abort_already_done name=%s start_seq=%d",
                rollout.adapter_name,
                rollout.start_seq,
            )
            return
        log.warning(
            "rollout.aborted_by_guard name=%s candidate=%d seq=%d reason=%s",
            rollout.adapter_name,
            rollout.candidate_revision,
            change.seq,
            reason,
        )
