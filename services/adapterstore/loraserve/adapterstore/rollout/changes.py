"""The Change each rollout operation makes, built from the freshest folded state.

As in changes.py, each function returns a ChangeBuilder for ChangeLog.commit: it only
reads the state it is given and raises the caller-facing error when the operation
does not apply (nothing is written then); None means there is nothing to commit.
"""

from __future__ import annotations

from dataclasses import replace

from loraserve.adapterstore.catalog import (
    Adapter,
    Change,
    ChangeType,
    StoreState,
    find_adapter,
    find_revision,
    now,
    refuse_yanked,
)
from loraserve.adapterstore.changelog import ChangeBuilder
from loraserve.adapterstore.rollout.records import ArmFigures, Guards, Rollout, RolloutState
from loraserve.common.errors import Aborted, FailedPrecondition


def rollout_started(
    name: str, revision: int, weight: float, guards: Guards, actor: str
) -> ChangeBuilder:
    """A rollout of an existing revision other than the current one, on an adapter
    with a current revision and no active rollout."""

    def build(state: StoreState, seq: int) -> Change:
        adapter = find_adapter(state, name)
        find_revision(adapter, revision)
        active = adapter.active_rollout
        if active is not None:
            raise FailedPrecondition(
                f"adapter {name!r} already has an active {active.describe()}; "
                "promote or abort it before starting another"
            )
        if adapter.current_revision == 0:
            raise FailedPrecondition(
                f"adapter {name!r} has no current revision to roll out from; make one "
                "current first (adapterctl rollback NAME REV)"
            )
        if revision == adapter.current_revision:
            raise FailedPrecondition(f"{name}@{revision} is the current revision already")
        refuse_yanked(adapter, revision, "rolled out")
        time = now()
        rollout = Rollout(
            adapter_name=name,
            candidate_revision=revision,
            current_revision=adapter.current_revision,
            weight=weight,
            state=RolloutState.ACTIVE,
            guards=guards,
            start_seq=seq,
            update_seq=seq,
            start_time=time,
            update_time=time,
            started_by=actor,
            updated_by=actor,
        )
        return _change(seq, adapter, rollout, adapter.current_revision)

    return build


def rollout_weight_set(name: str, weight: float, actor: str) -> ChangeBuilder:
    """The active rollout with another weight; None when it has that weight already."""

    def build(state: StoreState, seq: int) -> Change | None:
        adapter = find_adapter(state, name)
        active = _active(adapter, "change its weight")
        if active.weight == weight:
            return None
        time = now()
        rollout = replace(active, weight=weight, update_seq=seq, update_time=time, updated_by=actor)
        return _change(seq, adapter, rollout, adapter.current_revision)

    return build


def rollout_promoted(
    name: str, expected: int, figures: tuple[ArmFigures, ...], actor: str
) -> ChangeBuilder:
    """The candidate current and the rollout over, in one entry, when the candidate is
    the `expected` revision."""

    def build(state: StoreState, seq: int) -> Change:
        adapter = find_adapter(state, name)
        active = promotable(adapter, expected)
        rollout = _ended(active, RolloutState.PROMOTED, "", figures, seq, actor)
        return _change(seq, adapter, rollout, active.candidate_revision)

    return build


def rollout_aborted(
    name: str,
    reason: str,
    figures: tuple[ArmFigures, ...],
    actor: str,
    start_seq: int = 0,
) -> ChangeBuilder:
    """The active rollout over, the current revision unchanged. With `start_seq` (the
    store's own guards) only that rollout is aborted, and one that has ended already
    is nothing to do: every store replica may decide the same abort, one commits it."""

    def build(state: StoreState, seq: int) -> Change | None:
        adapter = find_adapter(state, name)
        if start_seq:
            active = adapter.active_rollout
            if active is None or active.start_seq != start_seq:
                return None
        else:
            active = _active(adapter, "abort it")
        rollout = _ended(active, RolloutState.ABORTED, reason, figures, seq, actor)
        return _change(seq, adapter, rollout, adapter.current_revision)

    return build


def promotable(adapter: Adapter, expected: int) -> Rollout:
    """The adapter's active rollout when its candidate is `expected`. Aborted otherwise:
    whoever reviewed `expected` has not reviewed the candidate now in the rollout (one
    aborted and started again meanwhile, say)."""
    active = _active(adapter, "promote it")
    if active.candidate_revision != expected:
        raise Aborted(
            f"the active {active.describe()} is not of {adapter.name}@{expected} as "
            f"expected; review @{active.candidate_revision} (adapterctl rollout status "
            f"{adapter.name}) and promote it with --expect {active.candidate_revision}"
        )
    return active


def _active(adapter: Adapter, what: str) -> Rollout:
    """The adapter's active rollout; FailedPrecondition saying why there is none."""
    rollout = adapter.rollout
    if rollout is None:
        raise FailedPrecondition(f"adapter {adapter.name!r} has no rollout to {what}")
    if not rollout.active:
        why = f": {rollout.end_reason}" if rollout.end_reason else ""
        raise FailedPrecondition(
            f"cannot {what}: the {rollout.describe()} was {rollout.state.value} at seq "
            f"{rollout.update_seq}{why}; start a new rollout"
        )
    return rollout


def _ended(
    rollout: Rollout,
    state: RolloutState,
    reason: str,
    figures: tuple[ArmFigures, ...],
    seq: int,
    actor: str,
) -> Rollout:
    return replace(
        rollout,
        state=state,
        end_reason=reason,
        final_figures=figures,
        update_seq=seq,
        update_time=now(),
        updated_by=actor,
    )


def _change(seq: int, adapter: Adapter, rollout: Rollout, current: int) -> Change:
    candidate = adapter.revisions[rollout.candidate_revision]
    return Change(
        seq,
        ChangeType.ROLLOUT_CHANGED,
        adapter.name,
        candidate,
        current,
        rollout.update_time,
        rollout.updated_by,
        record=rollout,
    )
