"""Rollout operations, independent of gRPC: start, change the weight, promote, abort,
read. Each write is one change-log commit built from the freshest state
(changes.py), with the client's idempotency key, as the store's other writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from loraserve.adapterstore.catalog import find_adapter
from loraserve.adapterstore.changelog import (
    ChangeBuilder,
    ChangeLog,
    RequestTag,
    check_idempotency_key,
    request_tag,
)
from loraserve.adapterstore.rollout.changes import (
    promotable,
    rollout_aborted,
    rollout_promoted,
    rollout_started,
    rollout_weight_set,
)
from loraserve.adapterstore.rollout.figures import refusals
from loraserve.adapterstore.rollout.guard import RolloutGuard
from loraserve.adapterstore.rollout.records import ArmFigures, Guards, Rollout, check_weight
from loraserve.adapterstore.signature_policy import ServedRevisionCheck
from loraserve.common.config.textlimits import MAX_ERROR_MESSAGE_BYTES, check_text
from loraserve.common.errors import FailedPrecondition, InvalidArgument, NotFound
from loraserve.common.revisions.manifest import Revision
from loraserve.common.revisions.names import validate_adapter_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RolloutResult:
    """A rollout after a change (or as it is), its candidate's manifest and the seq."""

    rollout: Rollout
    candidate: Revision
    seq: int


@dataclass(frozen=True, slots=True)
class RolloutView:
    """A rollout with both arms' figures (current first)."""

    rollout: Rollout
    candidate: Revision
    figures: tuple[ArmFigures, ...]
    candidate_by_replica: tuple[tuple[str, ArmFigures], ...]
    figures_time: datetime | None


class RolloutOps:
    def __init__(
        self,
        changelog: ChangeLog,
        guard: RolloutGuard,
        check_started: Callable[[], None],
        served: ServedRevisionCheck,
    ) -> None:
        self._log = changelog
        self._guard = guard
        self._check_started = check_started
        # The signature policy on a candidate (signature_policy.py).
        self._served = served

    async def start(
        self, name: str, revision: int, weight: float, guards: Guards, actor: str, key: str = ""
    ) -> RolloutResult:
        self._check_request(name, key)
        if revision < 1:
            raise InvalidArgument(f"revision must be >= 1, got {revision}")
        check_weight(weight)
        guards.check()
        await self._served.check(name, revision, "a rollout candidate")
        tag = request_tag(key, "rollout_start", name, revision, weight, guards.to_json())
        return await self._commit(name, rollout_started(name, revision, weight, guards, actor), tag)

    async def set_weight(
        self, name: str, weight: float, actor: str, key: str = ""
    ) -> RolloutResult:
        self._check_request(name, key)
        check_weight(weight)
        tag = request_tag(key, "rollout_weight", name, weight)
        return await self._commit(name, rollout_weight_set(name, weight, actor), tag)

    async def promote(
        self, name: str, expected: int, actor: str, key: str = "", force: bool = False
    ) -> RolloutResult:
        """Makes the candidate current when it is the `expected` revision (Aborted
        otherwise) and no live replica refuses it (FailedPrecondition), unless `force`."""
        self._check_request(name, key)
        if expected < 1:
            raise InvalidArgument(
                f"expected_candidate_revision is required: the candidate revision of "
                f"{name!r} you reviewed (adapterctl rollout status {name}), got {expected}"
            )
        tag = request_tag(key, "rollout_promote", name, expected, force)
        # A retry of a promote that was committed replays it, NACKs or not.
        if await self._log.committed(tag) is None:
            await self._log.sync()
            promotable(find_adapter(self._log.state, name), expected)
            nacks = await self._guard.nacks(name, expected)
            if nacks and not force:
                raise FailedPrecondition(
                    f"cannot promote {name}@{expected}: live replicas refuse it "
                    f"({refusals(name, nacks)}); fix them or abort the rollout, or promote "
                    "with force (adapterctl rollout promote --force) to serve it anyway"
                )
        build = rollout_promoted(name, expected, self._current_figures(name), actor)
        return await self._commit(name, build, tag)

    async def abort(self, name: str, reason: str, actor: str, key: str = "") -> RolloutResult:
        self._check_request(name, key)
        check_text("reason", reason, MAX_ERROR_MESSAGE_BYTES)
        figures = self._current_figures(name)
        tag = request_tag(key, "rollout_abort", name, reason)
        build = rollout_aborted(name, reason or f"aborted by {actor}", figures, actor)
        return await self._commit(name, build, tag)

    async def get(self, name: str) -> RolloutView:
        self._check_started()
        validate_adapter_name(name)
        await self._log.sync()
        adapter = find_adapter(self._log.state, name)
        rollout = adapter.rollout
        if rollout is None:
            raise NotFound(f"adapter {name!r} has no rollout")
        candidate = adapter.revisions[rollout.candidate_revision]
        if not rollout.active:
            return RolloutView(rollout, candidate, rollout.final_figures, (), rollout.update_time)
        evaluation = self._guard.latest.get(name)
        if evaluation is None or evaluation.start_seq != rollout.start_seq:
            return RolloutView(rollout, candidate, (), (), None)
        return RolloutView(
            rollout, candidate, evaluation.arms, evaluation.candidate_by_replica, evaluation.time
        )

    def _check_request(self, name: str, key: str) -> None:
        self._check_started()
        validate_adapter_name(name)
        check_idempotency_key(key)

    def _current_figures(self, name: str) -> tuple[ArmFigures, ...]:
        adapter = self._log.state.adapters.get(name)
        rollout = adapter.active_rollout if adapter is not None else None
        return self._guard.figures(rollout) if rollout is not None else ()

    async def _commit(
        self, name: str, build: ChangeBuilder, tag: RequestTag | None
    ) -> RolloutResult:
        change = await self._log.commit(build, tag)
        if change is None:
            # Nothing to change: the rollout as it is.
            adapter = find_adapter(self._log.state, name)
            assert adapter.rollout is not None
            candidate = adapter.revisions[adapter.rollout.candidate_revision]
            return RolloutResult(adapter.rollout, candidate, self._log.head_seq)
        assert isinstance(change.record, Rollout)
        assert change.revision is not None
        rollout = change.record
        log.info(
            "rollout.changed name=%s candidate=%d state=%s weight=%g seq=%d actor=%s",
            rollout.adapter_name,
            rollout.candidate_revision,
            rollout.state.value,
            rollout.weight,
            change.seq,
            change.actor,
        )
        return RolloutResult(rollout, change.revision, change.seq)
