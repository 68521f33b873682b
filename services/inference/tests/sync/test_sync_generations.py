"""The synchronizer against fakes when what it knew of the store no longer holds: the
store started afresh on an emptied bucket, or an adapter deleted and pushed again while
the watch was behind (issue 29, items 2 and 3). The same on real parts, engine and
all: tests/reliability/test_store_started_afresh.py."""

from __future__ import annotations

from loraserve.clients.store import Heartbeat, ListedAdapter, Listing
from loraserve.common.errors import OutOfRange
from loraserve.testing.fakes.sync import Harness, running
from loraserve.testing.fakes.sync_store import manifest


def _listed(seq: int, incarnation: str, *adapters: tuple[str, int, int]) -> Listing:
    """A listing of (name, current revision, create_seq), each revision committed at
    the seq its number says, in `incarnation`."""
    return Listing(
        tuple(ListedAdapter(n, manifest(n, r, seq=r), c) for n, r, c in adapters),
        seq,
        incarnation,
    )


async def test_relist_from_a_store_started_afresh_forgets_every_adapter_first() -> None:
    h = Harness(_listed(5, "first", ("a", 1, 1), ("b", 2, 2)))
    # The new store's a@1 is other content: only forgetting the old one serves it.
    h.store.listings.append(_listed(2, "second", ("a", 1, 1), ("c", 2, 2)))
    h.store.open_stream(OutOfRange("after_seq 5 is beyond the store's last commit 2"))
    h.store.open_stream()
    async with running(h):
        await h.settled(2)
        assert h.registry.current == {"a": 1, "c": 2}
        assert sorted(h.registry.deletes) == ["a", "b"]
        assert h.registry.installs[-2:] == [("a", 1, True), ("c", 2, True)]
        assert h.store.watch_incarnations[:2] == ["first", "second"]


async def test_a_heartbeat_of_another_incarnation_lists_again() -> None:
    h = Harness(_listed(5, "first", ("a", 1, 1)))
    h.store.listings.append(_listed(7, "second", ("d", 1, 1)))
    h.store.open_stream(Heartbeat(7, incarnation="second"))
    h.store.open_stream()
    async with running(h):
        await h.settled(7)
        assert h.registry.current == {"d": 1}
        assert h.registry.deletes == ["a"]


async def test_a_heartbeat_below_the_replicas_seq_lists_again() -> None:
    # A store that names no incarnation: its head going backwards is the only sign.
    h = Harness(_listed(5, "", ("a", 1, 1)))
    h.store.listings.append(_listed(1, "", ("e", 1, 1)))
    h.store.open_stream(Heartbeat(1))
    h.store.open_stream()
    async with running(h):
        await h.settled(1)
        assert h.registry.current == {"e": 1}
        assert h.registry.deletes == ["a"]


async def test_relist_after_delete_and_repush_drops_the_deleted_generation() -> None:
    h = Harness(_listed(2, "first", ("x", 2, 1)))
    # Deleted at seq 3, pushed again at 4 (revision 4, created at seq 4): missed.
    h.store.listings.append(_listed(4, "first", ("x", 4, 4)))
    h.store.open_stream(OutOfRange("after_seq 2 is older than the kept log"))
    h.store.open_stream()
    async with running(h):
        await h.settled(4)
        assert h.registry.deletes == ["x"]
        assert h.registry.current == {"x": 4}
        assert h.registry.held() == {"x": 4}


async def test_relist_of_the_same_generation_deletes_nothing() -> None:
    h = Harness(_listed(2, "first", ("x", 2, 1)))
    h.store.listings.append(_listed(3, "first", ("x", 3, 1)))
    h.store.open_stream(OutOfRange("after_seq 2 is older than the kept log"))
    h.store.open_stream()
    async with running(h):
        await h.settled(3)
        assert h.registry.deletes == []
        assert h.registry.current == {"x": 3}
