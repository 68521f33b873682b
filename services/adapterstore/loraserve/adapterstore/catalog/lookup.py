"""Lookups of adapters and revisions in a folded StoreState.

They only read: a miss raises NotFound (a bad number InvalidArgument) with the
message callers see, and `detached` hands out copies that later folds of the
state leave alone.
"""

from __future__ import annotations

from dataclasses import replace

from loraserve.adapterstore.catalog.model import Adapter, StoreState
from loraserve.common.errors import FailedPrecondition, InvalidArgument, NotFound
from loraserve.common.revisions.manifest import Revision


def find_adapter(state: StoreState, name: str) -> Adapter:
    adapter = state.adapters.get(name)
    if adapter is None and name in state.deleted_latest:
        raise NotFound(f"adapter {name!r} not found: it was deleted")
    if adapter is None:
        raise NotFound(f"adapter {name!r} not found")
    return adapter


def refuse_during_rollout(adapter: Adapter, advice: str) -> None:
    """FailedPrecondition while the adapter has an active rollout, with `advice`: a
    change of its current revision would move one arm behind the rollout's back."""
    rollout = adapter.active_rollout
    if rollout is not None:
        raise FailedPrecondition(
            f"adapter {adapter.name!r} has an active {rollout.describe()}; {advice}"
        )


def find_revision(adapter: Adapter, revision: int) -> Revision:
    """Revision `revision` of `adapter`; 0 means the current one."""
    if revision < 0:
        raise InvalidArgument(f"revision must not be negative, got {revision}")
    number = revision or adapter.current_revision
    if number == 0:
        raise NotFound(f"adapter {adapter.name!r} has no current revision")
    found = adapter.revisions.get(number)
    if found is None:
        raise NotFound(f"revision {adapter.name}@{number} not found")
    return found


def detached(adapter: Adapter) -> Adapter:
    """A copy that later changes to the state leave alone (revisions are immutable)."""
    return replace(adapter, revisions=dict(adapter.revisions))
