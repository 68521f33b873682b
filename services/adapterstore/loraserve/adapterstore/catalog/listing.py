"""Listing pages cut from a folded StoreState.

A page holds at most `page_size` entries whose encoded sizes add up to at most
`max_page_bytes`, and is never empty while entries remain. Every page of an
adapter listing carries the first page's seq, in its token and its `seq`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field

from loraserve.adapterstore.catalog import pagetokens
from loraserve.adapterstore.catalog.lookup import detached
from loraserve.adapterstore.catalog.model import Adapter, StoreState
from loraserve.adapterstore.catalog.yank_record import YankMark
from loraserve.common.config.textlimits import PageFill
from loraserve.common.errors import InvalidArgument
from loraserve.common.quota import Quota
from loraserve.common.revisions.manifest import Revision


@dataclass(frozen=True, slots=True)
class AdapterPage:
    adapters: list[Adapter]
    next_page_token: str
    seq: int
    incarnation: str
    # The default quota as of the page's state (adapters carry their own).
    default_quota: Quota | None = None


@dataclass(frozen=True, slots=True)
class RevisionPage:
    revisions: list[Revision]
    next_page_token: str
    current_revision: int
    # The yanks of the page's yanked revisions, by number.
    yanks: dict[int, YankMark] = field(default_factory=dict)


def adapter_page(
    state: StoreState,
    size: int,
    max_page_bytes: int,
    seq: int,
    incarnation: str,
    after: str,
    base_model: str,
    size_of: Callable[[Adapter], int],
) -> AdapterPage:
    """The adapters named after `after`, for a listing at `seq` (which `state` has reached).
    It starts from a bisect of the sorted names, so a page costs its own adapters
    (and those the base-model filter skips), not the whole store."""
    names = state.names
    selected: list[Adapter] = []
    fill = PageFill(size, max_page_bytes)
    next_token = ""
    for index in range(bisect.bisect_right(names, after), len(names)):
        name = names[index]
        adapter = state.adapters[name]
        current = adapter.current
        if base_model and (current is None or current.base_model != base_model):
            continue
        if not fill.room_for(size_of(adapter)):
            next_token = pagetokens.encode_listing_token(seq, incarnation, selected[-1].name)
            break
        selected.append(detached(adapter))
    return AdapterPage(selected, next_token, seq, incarnation, state.default_quota)


def revision_page(
    adapter: Adapter,
    size: int,
    max_page_bytes: int,
    before: int,
    size_of: Callable[[Revision, YankMark | None], int],
) -> RevisionPage:
    """The adapter's revisions, newest first, older than `before` (0: from the newest);
    `size_of` is a revision's encoded size with its yank, if any."""
    if before > adapter.latest_revision:
        raise InvalidArgument(
            f"page_token names revision {before}, beyond {adapter.name}'s latest "
            f"{adapter.latest_revision}; list from the first page"
        )
    before = before or adapter.latest_revision + 1
    numbers = sorted((n for n in adapter.revisions if n < before), reverse=True)
    fill = PageFill(size, max_page_bytes)
    page: list[int] = []
    for number in numbers:
        if not fill.room_for(size_of(adapter.revisions[number], adapter.yanks.get(number))):
            break
        page.append(number)
    next_token = (
        pagetokens.encode_revisions_token(adapter.name, page[-1])
        if len(numbers) > len(page)
        else ""
    )
    yanks = {n: adapter.yanks[n] for n in page if n in adapter.yanks}
    revisions = [adapter.revisions[n] for n in page]
    return RevisionPage(revisions, next_token, adapter.current_revision, yanks)
