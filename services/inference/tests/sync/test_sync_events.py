"""The synchronizer applying store events against fakes: install, route, roll back, delete, fold.

The end-to-end behaviour (real store, real engine) is in tests/test_hot_swap.py.
"""

from __future__ import annotations

import asyncio

from loraserve.common.fleet.reports import ServingState
from loraserve.testing.fakes.sync import Harness, running
from loraserve.testing.fakes.sync_store import current_set, deleted, listing, manifest, pushed
from loraserve.testing.waiting import eventually


async def test_pushed_current_revision_is_installed_routed_acked_and_timed() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.registry.installs[-1] == ("a", 2, True)
        assert h.registry.current["a"] == 2
        await h.reported("a", (2, {2: ServingState.LOADED}))
        assert len(h.swaps) == 1


async def test_loads_hand_the_listed_and_pushed_manifests_to_the_fetcher() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.fetcher.given == [manifest("a", 1), manifest("a", 2)]


async def test_pushed_revision_not_promoted_is_loaded_without_routing() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False))
        await h.settled(2)
        assert h.registry.installs[-1] == ("a", 2, False)
        assert h.registry.current["a"] == 1
        await h.reported("a", (1, {1: ServingState.LOADED}))


async def test_rollback_to_an_installed_revision_only_moves_the_route() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False))
        await h.settled(2)
        h.feed(stream, current_set(3, "a", 2))
        await h.settled(3)
        assert h.registry.set_currents == [("a", 2)]
        assert h.fetcher.calls == [("a", 1), ("a", 2)]
        await h.reported("a", (2, {2: ServingState.LOADED}))


async def test_rollback_to_a_retired_revision_fetches_and_installs_it_again() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        h.feed(stream, current_set(3, "a", 1))
        await h.settled(3)
        assert h.registry.current["a"] == 1
        assert h.registry.installs[-1] == ("a", 1, True)


async def test_delete_unroutes_the_adapter_and_drops_it_from_the_report() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        await h.reported("a", (1, {1: ServingState.LOADED}))
        h.feed(stream, deleted(2, "a"))
        await h.settled(2)
        assert h.registry.deletes == ["a"]
        await h.reported("a", None)


async def test_events_queued_behind_a_slow_load_fold_into_the_latest_current_revision() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.gates[("a", 2)] = gate = asyncio.Event()
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await eventually(lambda: ("a", 2) in h.fetcher.calls, "fetch of a@2 started")
        for event in (pushed(3, "a", 3), pushed(4, "a", 4), pushed(5, "a", 5)):
            stream.put_nowait(event)
        await eventually(lambda: stream.empty(), "events taken in")
        gate.set()
        await h.settled(5)
        assert h.fetcher.calls == [("a", 1), ("a", 2), ("a", 5)]
        assert h.registry.current["a"] == 5


async def test_deleted_then_pushed_again_drops_old_revisions_first() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.gates[("a", 1)] = gate = asyncio.Event()
    stream = h.store.open_stream()
    async with running(h):
        await eventually(lambda: ("a", 1) in h.fetcher.calls, "initial fetch started")
        stream.put_nowait(deleted(2, "a"))
        stream.put_nowait(pushed(3, "a", 2))
        await eventually(lambda: stream.empty(), "events taken in")
        gate.set()
        await h.settled(3)
        assert h.registry.deletes == ["a"]
        assert h.registry.current == {"a": 2}
