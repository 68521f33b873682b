"""Quota operations, independent of gRPC: set or clear an adapter's quota or the
default, and read them all. Each write is one change-log commit (a QUOTA_SET entry,
quota_record.py) built from the freshest state, with the client's idempotency key,
as the store's other writes; setting what is already set commits nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from loraserve.adapterstore.catalog import (
    DEFAULT_QUOTA,
    Change,
    ChangeType,
    QuotaChange,
    StoreState,
    find_adapter,
    now,
)
from loraserve.adapterstore.changelog import (
    ChangeBuilder,
    ChangeLog,
    check_idempotency_key,
    request_tag,
)
from loraserve.common.quota import Quota
from loraserve.common.revisions.names import validate_adapter_name

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QuotaListing:
    """Every quota as of `seq`: the default, and each adapter's own by name."""

    default: Quota | None
    quotas: tuple[tuple[str, Quota], ...]
    seq: int


def quota_set(name: str, quota: Quota | None, actor: str) -> ChangeBuilder:
    """The quota of `name` (DEFAULT_QUOTA: the default) after the change; the adapter
    must exist (NotFound). None when it has that quota already."""

    def build(state: StoreState, seq: int) -> Change | None:
        before = state.default_quota if name == DEFAULT_QUOTA else find_adapter(state, name).quota
        if before == quota:
            return None
        record = QuotaChange(quota)
        return Change(seq, ChangeType.QUOTA_SET, name, None, 0, now(), actor, record=record)

    return build


class QuotaOps:
    def __init__(self, changelog: ChangeLog, check_started: Callable[[], None]) -> None:
        self._log = changelog
        self._check_started = check_started

    async def set(self, name: str, quota: Quota | None, actor: str, key: str = "") -> int:
        """Commits the quota of `name` ("" for the default; None clears it); returns
        the seq every replica enforces it from (the head's when nothing changed)."""
        self._check_started()
        if name != DEFAULT_QUOTA:
            validate_adapter_name(name)
        check_idempotency_key(key)
        limits = None if quota is None else quota.to_json()
        tag = request_tag(key, "quota_set", name, limits)
        change = await self._log.commit(quota_set(name, quota, actor), tag)
        if change is None:
            return self._log.head_seq
        log.info(
            "quota.set name=%s quota=%s seq=%d actor=%s",
            name or "(default)",
            quota.describe() if quota is not None else "(cleared)",
            change.seq,
            change.actor,
        )
        return change.seq

    async def list(self) -> QuotaListing:
        self._check_started()
        await self._log.sync()
        state = self._log.state
        own = tuple(
            (name, quota)
            for name in state.names
            if (quota := state.adapters[name].quota) is not None
        )
        return QuotaListing(state.default_quota, own, state.seq)
