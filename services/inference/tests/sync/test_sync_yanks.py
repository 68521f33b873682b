"""Sync hands the store's yanks to the registry (issue 54, item 5): a watched yank or
unyank at once, a listing's yanks all at once, a delete drops the adapter's."""

from __future__ import annotations

from collections.abc import Mapping

from loraserve.clients.store import EventKind, ListedAdapter, Listing, StoreEvent
from loraserve.clients.storetypes import Yank
from loraserve.common.revisions.manifest import RevisionKey
from loraserve.inference.sync.yanks import YankFollower
from loraserve.testing.fakes.sync_store import manifest


class _Sink:
    def __init__(self) -> None:
        self.yanks: dict[RevisionKey, str] = {}

    def set_yanks(self, yanks: Mapping[RevisionKey, str]) -> None:
        self.yanks = dict(yanks)


def _yank_event(seq: int, name: str, revision: int, reason: str | None) -> StoreEvent:
    yank = Yank(revision, reason) if reason is not None else None
    return StoreEvent(seq, EventKind.YANK_CHANGED, name, manifest(name, revision), 2, yank=yank)


def test_a_watched_yank_reaches_the_registry_and_an_unyank_lifts_it() -> None:
    sink = _Sink()
    follower = YankFollower(sink)

    assert follower.take_event(_yank_event(5, "alpha", 1, "leaks"))
    assert sink.yanks == {RevisionKey("alpha", 1): "leaks"}
    assert follower.take_event(_yank_event(6, "alpha", 1, None))
    assert sink.yanks == {}


def test_a_listing_replaces_every_yank_and_a_delete_drops_the_adapters() -> None:
    sink = _Sink()
    follower = YankFollower(sink)
    follower.take_event(_yank_event(3, "gone", 1, "old"))
    listing = Listing(
        (
            ListedAdapter("alpha", manifest("alpha", 3), yanks=(Yank(1, "a"), Yank(2, "b"))),
            ListedAdapter("beta", manifest("beta", 2), yanks=(Yank(1, "c"),)),
        ),
        seq=9,
    )

    follower.take_listing(listing)
    deleted = StoreEvent(10, EventKind.ADAPTER_DELETED, "alpha", None, 0)

    assert sink.yanks == {
        RevisionKey("alpha", 1): "a",
        RevisionKey("alpha", 2): "b",
        RevisionKey("beta", 1): "c",
    }
    assert not follower.take_event(deleted)
    assert sink.yanks == {RevisionKey("beta", 1): "c"}
