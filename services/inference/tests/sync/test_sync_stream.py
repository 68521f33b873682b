"""The synchronizer's watch stream against fakes: reconnects, relists, reports sent again.

The end-to-end behaviour (real store, real engine) is in tests/test_hot_swap.py.
"""

from __future__ import annotations

from dataclasses import replace

from loraserve.clients.store import ListedAdapter, Listing
from loraserve.common.errors import OutOfRange, Unavailable
from loraserve.common.fleet.reports import ServingState
from loraserve.inference.sync import Synchronizer
from loraserve.testing.fakes.sync import FAST, Harness, running
from loraserve.testing.fakes.sync_store import listing, manifest, pushed
from loraserve.testing.waiting import eventually


async def test_watch_reconnects_after_the_last_received_seq_and_applies_nothing_twice() -> None:
    h = Harness(listing(1, ("a", 1)))
    first = h.store.open_stream()
    # The store may replay from its own position; events already taken are skipped.
    h.store.open_stream(pushed(2, "a", 2), pushed(3, "a", 3))
    async with running(h):
        await h.started()
        h.feed(first, pushed(2, "a", 2), Unavailable("connection reset"))
        await h.settled(3)
        assert h.store.watch_calls[:2] == [1, 2]
        assert h.registry.installs == [("a", 1, True), ("a", 2, True), ("a", 3, True)]


async def test_watch_out_of_range_lists_again_and_reconciles() -> None:
    h = Harness(listing(1, ("a", 1), ("b", 1)))
    h.store.listings.append(listing(9, ("a", 3), ("c", 1)))
    h.store.open_stream(OutOfRange("after_seq 1 is older than the kept log"))
    h.store.open_stream()
    async with running(h):
        await h.settled(9)
        assert h.registry.current == {"a": 3, "c": 1}
        assert h.registry.deletes == ["b"]
        await eventually(lambda: h.store.watch_calls == [1, 9], "watch from 9")


async def test_relist_where_an_adapter_has_no_current_revision_unroutes_it() -> None:
    # Deleted, then pushed again unpromoted, while this replica was behind.
    h = Harness(listing(1, ("a", 1), ("b", 1)))
    h.store.listings.append(
        Listing((ListedAdapter("a", None), ListedAdapter("b", manifest("b", 1))), 9)
    )
    h.store.open_stream(OutOfRange("after_seq 1 is older than the kept log"))
    h.store.open_stream()
    async with running(h):
        await h.settled(9)
        assert h.registry.deletes == ["a"]
        assert h.registry.current == {"b": 1}


async def test_a_hole_in_the_event_seqs_lists_again() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.store.listings.append(listing(5, ("a", 4)))
    h.store.open_stream(pushed(5, "a", 4))
    h.store.open_stream()
    async with running(h):
        await h.settled(5)
        assert h.store.list_calls == 2
        assert h.registry.current["a"] == 4


async def test_report_that_fails_is_sent_again_at_the_next_flush() -> None:
    h = Harness(listing(1))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        await eventually(lambda: len(h.store.batches) == 1, "the first report")
        h.store.report_failures.append(Unavailable("store down"))
        h.feed(stream, pushed(2, "a", 1))
        await h.settled(2)
        await h.reported("a", (1, {1: ServingState.LOADED}))
        assert h.store.report_failures == []


async def test_replica_reports_its_adapters_again_when_the_store_forgot_its_statuses() -> None:
    h = Harness(listing(1, ("a", 1), ("b", 2)))
    often = replace(FAST.reports, interval_s=0.01)
    h.sync = Synchronizer(h.store, h.registry, settings=replace(FAST, reports=often))
    h.store.open_stream()
    async with running(h):
        await h.started()
        await h.reported("a", (1, {1: ServingState.LOADED}))
        await h.reported("b", (2, {2: ServingState.LOADED}))
        h.store.shards.clear()
        h.store.known = [False]
        await h.reported("a", (1, {1: ServingState.LOADED}))
        await h.reported("b", (2, {2: ServingState.LOADED}))
