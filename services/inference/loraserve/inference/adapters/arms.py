"""The candidate arms of active rollouts on this replica: which requests go to them
(rollouts.Splits), loading them, and what a candidate that cannot run here does.

A candidate is held in the engine for as long as its rollout lasts (`holds`), as a
current revision is. It loads like any revision (once, however many ask): ahead of
its requests when sync warms it, else on its first request. A candidate that this
replica cannot serve (its manifest or its load fails) is listed FAILED, which the
store sees as a NACK, and its requests go to the current revision instead: a broken
candidate on one replica costs no request, and its guard aborts the rollout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from loraserve.clients.store import RolloutSplit
from loraserve.common.errors import TRANSIENT_ERRORS, LoraserveError
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.inference.adapters.compat import AdapterFacts, manifest_facts
from loraserve.inference.adapters.loads import RevisionLoads
from loraserve.inference.adapters.ports import RegistryObserver
from loraserve.inference.adapters.rollouts import Splits
from loraserve.inference.adapters.state import RevisionEntry, RevisionLife

log = logging.getLogger(__name__)

# Lists a revision that cannot run here as FAILED, with the error that says why.
MarkFailed = Callable[[Revision, LoraserveError], None]


class CandidateArms:
    def __init__(
        self,
        entries: dict[RevisionKey, RevisionEntry],
        loads: RevisionLoads,
        check_facts: Callable[[AdapterFacts], None],
        mark_failed: MarkFailed,
        update: Callable[[RevisionEntry], None],
        changed: Callable[[str], None],
        observer: RegistryObserver | None,
    ) -> None:
        self.splits = Splits()
        self._entries = entries
        self._loads = loads
        self._check_facts = check_facts
        self._mark_failed = mark_failed
        self._update = update
        self._changed = changed
        self._observer = observer

    def holds(self, entry: RevisionEntry) -> bool:
        """Whether the revision is a candidate, kept READY as a current one is."""
        return self.splits.is_candidate(entry.name, entry.revision)

    def set(self, name: str, split: RolloutSplit) -> None:
        """Splits the name's requests as `split` says. Raises FailedPrecondition (and
        lists the candidate FAILED) when its manifest shows it cannot run here; the
        split then sends every request to the current revision."""
        previous = self.splits.get(name)
        if previous == split:
            return
        if previous is not None and previous.candidate.key != split.candidate.key:
            self.end(name)
        self.splits.set(name, split)
        self._changed(name)
        if self._observer is not None:
            self._observer.rollout_set(name, split.candidate.revision)
        try:
            self._check_facts(manifest_facts(split.candidate))
        except LoraserveError as exc:
            self._mark_failed(split.candidate, exc)
            raise

    def end(self, name: str) -> None:
        """Every request for the name goes to its current revision again; the
        candidate drains and leaves unless it became current."""
        split = self.splits.end(name)
        if split is None:
            return
        entry = self._entries.get(split.candidate.key)
        if entry is not None:
            self._update(entry)
        self._changed(name)
        if self._observer is not None:
            self._observer.rollout_ended(name)

    async def install(self, name: str) -> None:
        """Loads the name's candidate ahead of its requests. Raises a transient error
        to be retried; lists it FAILED and raises when it cannot run here."""
        split = self.splits.get(name)
        if split is None:
            return
        try:
            await self._loads.ensure_loaded(split.candidate.key, split.candidate, self._claim)
        except TRANSIENT_ERRORS:
            raise
        except LoraserveError as exc:
            self._mark_failed(split.candidate, exc)
            raise

    async def entry_for(self, name: str, key: str) -> RevisionEntry | None:
        """The candidate's entry, loaded, when this request goes to it; None sends
        it to the current revision (the current arm, or a candidate that cannot run
        here)."""
        candidate = self.splits.choose_candidate(name, key)
        if candidate is None:
            return None
        entry = self._entries.get(candidate.key)
        if entry is not None and entry.state is RevisionLife.FAILED:
            return None
        try:
            return await self._loads.ensure_loaded(candidate.key, candidate, self._claim)
        except LoraserveError as exc:
            if not isinstance(exc, TRANSIENT_ERRORS):
                self._mark_failed(candidate, exc)
            log.warning(
                "rollout.candidate_unavailable name=%s rev=%d reason=%s: serving the "
                "current revision",
                name,
                candidate.revision,
                exc.message,
            )
            return None

    def _claim(self, entry: RevisionEntry) -> None:
        self._update(entry)
        self._changed(entry.name)
