"""Revisions an older store kept with a field over today's limits, served without it.

Before every stored field was bounded (textlimits), a store could commit, say, a
15 MiB signature under signature policy `off`: every reply carrying that revision
(GetAdapter, a listing page, a watch event) was then over gRPC's message limits, so
every replica's sync stopped. Log entries and snapshots are history and are never
rewritten; instead the store reads such a revision without the oversized field,
names it in `Revision.withheld_fields` and logs `catalog.field_withheld`, so a store
recovers by restarting, without anyone editing the bucket. The next snapshot keeps
the revision as served.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from loraserve.adapterstore.catalog.model import Change, StoreState
from loraserve.common.config.textlimits import (
    MAX_BASE_MODEL_BYTES,
    MAX_DESCRIPTION_BYTES,
    MAX_SIGNATURE_BYTES,
    MAX_TARGET_MODULES_BYTES,
)
from loraserve.common.revisions.manifest import Revision

log = logging.getLogger(__name__)


def _text_size(value: str) -> int:
    # What was stored may not be text at all (a lone surrogate from a JSON escape).
    return len(value.encode(errors="surrogatepass"))


class _Bound(NamedTuple):
    field: str
    size: Callable[[Revision], int]
    limit: int
    # What the revision is served with instead: the field emptied, and what goes
    # with it.
    served: dict[str, Any]


# Each bounded field of a stored revision (target_modules by its total: what a reply
# carries). A withheld signature takes `signed_by` with it: a signer shown without
# the signature would claim what no one can check.
_BOUNDS = (
    _Bound(
        "signature",
        lambda r: len(r.signature),
        MAX_SIGNATURE_BYTES,
        {"signature": b"", "signed_by": ""},
    ),
    _Bound(
        "description",
        lambda r: _text_size(r.description),
        MAX_DESCRIPTION_BYTES,
        {"description": ""},
    ),
    _Bound(
        "base_model", lambda r: _text_size(r.base_model), MAX_BASE_MODEL_BYTES, {"base_model": ""}
    ),
    _Bound(
        "target_modules",
        lambda r: sum(_text_size(m) for m in r.target_modules),
        MAX_TARGET_MODULES_BYTES,
        {"target_modules": ()},
    ),
)


def within_limits(revision: Revision) -> Revision:
    """`revision` as the store serves it: each field over its limit emptied and named
    in `withheld_fields`; the same object when nothing is over."""
    changes: dict[str, Any] = {}
    withheld = set(revision.withheld_fields)
    for bound in _BOUNDS:
        size = bound.size(revision)
        if size <= bound.limit:
            continue
        log.warning(
            "catalog.field_withheld adapter=%s revision=%d field=%s size=%d limit=%d",
            revision.adapter_name,
            revision.revision,
            bound.field,
            size,
            bound.limit,
        )
        changes |= bound.served
        withheld.add(bound.field)
    if not changes:
        return revision
    return replace(revision, withheld_fields=tuple(sorted(withheld)), **changes)


def change_within_limits(change: Change) -> Change:
    """A log entry as the store serves it: its revision `within_limits`."""
    if change.revision is None:
        return change
    revision = within_limits(change.revision)
    return change if revision is change.revision else replace(change, revision=revision)


def state_within_limits(state: StoreState) -> None:
    """Every revision of a snapshot just read `within_limits`, before the state is
    shared or encoded."""
    for name, adapter in list(state.adapters.items()):
        revisions = {number: within_limits(r) for number, r in adapter.revisions.items()}
        if any(revisions[number] is not r for number, r in adapter.revisions.items()):
            state.adapters[name] = replace(adapter, revisions=revisions)
