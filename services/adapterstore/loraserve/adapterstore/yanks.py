"""Yank operations, independent of gRPC: mark a revision as one no replica may serve
pinned (with why), and lift the mark. Each is one change-log commit (a YANK_SET entry,
catalog/yank_record.py) built from the freshest state, with the client's idempotency
key, as the store's other writes; asking for what is already so commits nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from loraserve.adapterstore.catalog import (
    MAX_YANK_REASON_BYTES,
    MAX_YANKS_PER_ADAPTER,
    Adapter,
    Change,
    ChangeType,
    StoreState,
    YankChange,
    YankMark,
    find_adapter,
    find_revision,
    now,
)
from loraserve.adapterstore.changelog import (
    ChangeBuilder,
    ChangeLog,
    check_idempotency_key,
    request_tag,
)
from loraserve.common.config.textlimits import check_text
from loraserve.common.errors import FailedPrecondition, InvalidArgument
from loraserve.common.revisions.names import validate_adapter_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class YankResult:
    """A revision's yank after a yank, and the seq every replica refuses it from."""

    revision: int
    mark: YankMark
    seq: int


def revision_yanked(name: str, revision: int, reason: str, actor: str) -> ChangeBuilder:
    """The revision yanked with `reason`; None when it is yanked with that reason
    already. Neither the current revision nor an active rollout's candidate: a replica
    would have to serve what it must refuse."""

    def build(state: StoreState, seq: int) -> Change | None:
        adapter = find_adapter(state, name)
        target = find_revision(adapter, revision)
        _check_yankable(adapter, revision)
        before = adapter.yanks.get(revision)
        if before is not None and before.reason == reason:
            return None
        time = now()
        record = YankChange(YankMark(reason, actor, time, seq))
        current = adapter.current_revision
        return Change(seq, ChangeType.YANK_SET, name, target, current, time, actor, record=record)

    return build


def revision_unyanked(name: str, revision: int, actor: str) -> ChangeBuilder:
    """The revision's yank lifted; None when it is not yanked."""

    def build(state: StoreState, seq: int) -> Change | None:
        adapter = find_adapter(state, name)
        target = find_revision(adapter, revision)
        if revision not in adapter.yanks:
            return None
        current = adapter.current_revision
        record = YankChange(None)
        return Change(seq, ChangeType.YANK_SET, name, target, current, now(), actor, record=record)

    return build


def _check_yankable(adapter: Adapter, revision: int) -> None:
    key = f"{adapter.name}@{revision}"
    if revision == adapter.current_revision:
        raise FailedPrecondition(
            f"{key} is the current revision: make another one current first "
            f"(adapterctl rollback {adapter.name} REV), then yank it"
        )
    active = adapter.active_rollout
    if active is not None and active.candidate_revision == revision:
        raise FailedPrecondition(
            f"{key} is the candidate of the active {active.describe()}: abort it first "
            f"(adapterctl rollout abort {adapter.name}), then yank it"
        )
    if revision not in adapter.yanks and len(adapter.yanks) >= MAX_YANKS_PER_ADAPTER:
        raise FailedPrecondition(
            f"adapter {adapter.name!r} has {len(adapter.yanks)} yanked revisions, the most "
            "it may have: unyank some, or delete the adapter"
        )


class YankOps:
    def __init__(self, changelog: ChangeLog, check_started: Callable[[], None]) -> None:
        self._log = changelog
        self._check_started = check_started

    async def yank(
        self, name: str, revision: int, reason: str, actor: str, key: str = ""
    ) -> YankResult:
        """Commits the revision's yank; the result has the seq every replica refuses
        its pins from (the head's when it was yanked with that reason already)."""
        self._check_request(name, revision, key)
        check_text("reason", reason, MAX_YANK_REASON_BYTES)
        if not reason.strip():
            raise InvalidArgument("a yank needs a reason: say why the revision must not be served")
        tag = request_tag(key, "yank", name, revision, reason)
        change = await self._log.commit(revision_yanked(name, revision, reason, actor), tag)
        if change is None:
            mark = find_adapter(self._log.state, name).yanks[revision]
            return YankResult(revision, mark, self._log.head_seq)
        assert isinstance(change.record, YankChange)
        assert change.record.mark is not None
        log.info(
            "revision.yanked name=%s rev=%d seq=%d actor=%s reason=%s",
            name,
            revision,
            change.seq,
            change.actor,
            reason,
        )
        return YankResult(revision, change.record.mark, change.seq)

    async def unyank(self, name: str, revision: int, actor: str, key: str = "") -> int:
        """Lifts the revision's yank; returns the seq of the change (the head's when
        it was not yanked)."""
        self._check_request(name, revision, key)
        tag = request_tag(key, "unyank", name, revision)
        change = await self._log.commit(revision_unyanked(name, revision, actor), tag)
        if change is None:
            return self._log.head_seq
        log.info(
            "revision.unyanked name=%s rev=%d seq=%d actor=%s",
            name,
            revision,
            change.seq,
            change.actor,
        )
        return change.seq

    def _check_request(self, name: str, revision: int, key: str) -> None:
        self._check_started()
        validate_adapter_name(name)
        check_idempotency_key(key)
        if revision < 1:
            raise InvalidArgument(f"revision must be >= 1, got {revision}")
