"""Lazy residency on the sync side: start-up loads a bounded prefetch set and only
routes the rest; at run time resident adapters swap warm and others only move
their route."""

from __future__ import annotations

from dataclasses import replace

from loraserve.common.fleet.reports import ServingState
from loraserve.testing.fakes.sync import FAST, Harness, running
from loraserve.testing.fakes.sync_store import listing, pushed

NAMES = ("a", "b", "c", "d", "e")


def five_adapters(prefetch: int, recent: list[str] | None = None) -> Harness:
    return Harness(
        listing(1, *((name, 1) for name in NAMES)),
        replace(FAST, prefetch_adapters=prefetch),
        (lambda: list(recent)) if recent is not None else None,
    )


async def test_start_up_loads_only_the_prefetch_set_and_routes_the_rest() -> None:
    h = five_adapters(prefetch=2)
    async with running(h):
        await h.started()
        assert sorted(h.fetcher.calls) == [("a", 1), ("b", 1)]
        assert h.registry.current == {"a": 1, "b": 1}
        assert h.registry.targets == {"c": 1, "d": 1, "e": 1}
        assert h.sync.applied_seq == 1


async def test_prefetch_takes_the_adapters_served_most_recently_first() -> None:
    h = five_adapters(prefetch=2, recent=["e", "gone", "d", "a"])
    async with running(h):
        await h.started()
        assert sorted(h.fetcher.calls) == [("d", 1), ("e", 1)]


async def test_new_revision_of_an_adapter_not_loaded_only_moves_its_route() -> None:
    h = five_adapters(prefetch=1)
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "c", 2))
        await h.settled(2)
        assert ("c", 2) not in h.fetcher.calls
        assert h.registry.targets["c"] == 2
        await h.reported("c", (2, {2: ServingState.ROUTED}))


async def test_new_revision_of_a_loaded_adapter_is_loaded_before_its_route_moves() -> None:
    h = five_adapters(prefetch=1)
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.registry.installs[-1] == ("a", 2, True)
        await h.reported("a", (2, {2: ServingState.LOADED}))


async def test_new_adapter_is_loaded_at_once_while_fewer_than_the_prefetch_count_are() -> None:
    h = Harness(listing(1, ("a", 1)), replace(FAST, prefetch_adapters=2))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "b", 1), pushed(3, "c", 1))
        await h.settled(3)
        assert h.registry.current == {"a": 1, "b": 1}
        assert h.registry.targets == {"c": 1}


async def test_pushed_revision_not_promoted_of_an_adapter_not_loaded_is_not_loaded() -> None:
    h = five_adapters(prefetch=1)
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "c", 2, promote=False))
        await h.settled(2)
        assert ("c", 2) not in h.fetcher.calls
        assert h.registry.targets["c"] == 1


async def test_listing_hands_lazily_routed_adapters_their_manifests() -> None:
    h = five_adapters(prefetch=0)
    async with running(h):
        await h.started()
        assert h.fetcher.calls == []
        assert h.registry.targets == dict.fromkeys(NAMES, 1)
