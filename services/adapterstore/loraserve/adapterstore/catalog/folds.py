"""Folds of the changes that only touch an adapter that exists: its current revision
moved, the adapter deleted, a revision yanked or unyanked. `StoreState.apply`
(model.py) is the only caller; model.py keeps the folds that create adapters or
replace a whole record.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from loraserve.adapterstore.catalog.yank_record import YankChange
from loraserve.common.errors import DataLoss
from loraserve.common.revisions.manifest import Revision

if TYPE_CHECKING:
    from loraserve.adapterstore.catalog.model import Change, StoreState


def require_revision(change: Change) -> Revision:
    if change.revision is None:
        raise DataLoss(f"log entry {change.seq} ({change.type.value}) has no revision")
    return change.revision


def fold_current_set(state: StoreState, change: Change) -> None:
    name = change.adapter_name
    revision = require_revision(change)
    adapter = state.adapters.get(name)
    if adapter is None or revision.revision not in adapter.revisions:
        raise DataLoss(f"log entry {change.seq} promotes unknown {name}@{revision.revision}")
    adapter.current_revision = revision.revision
    adapter.update_time = change.time


def fold_delete(state: StoreState, change: Change) -> None:
    name = change.adapter_name
    adapter = state.adapters.get(name)
    if adapter is None:
        raise DataLoss(f"log entry {change.seq} deletes unknown adapter {name}")
    state.deleted_latest[name] = adapter.latest_revision
    del state.adapters[name]
    del state.names[bisect.bisect_left(state.names, name)]


def fold_yank(state: StoreState, change: Change) -> None:
    """The revision's yank after the change replaces its yank; the adapter's yanks
    are replaced, never changed in place, so copies of the state may share them."""
    name = change.adapter_name
    revision = require_revision(change).revision
    adapter = state.adapters.get(name)
    record = change.record
    if adapter is None or revision not in adapter.revisions or not isinstance(record, YankChange):
        raise DataLoss(f"log entry {change.seq} yanks unknown {name}@{revision}")
    yanks = dict(adapter.yanks)
    if record.mark is None:
        yanks.pop(revision, None)
    else:
        yanks[revision] = record.mark
    adapter.yanks = yanks
