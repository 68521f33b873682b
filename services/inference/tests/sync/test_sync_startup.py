"""The synchronizer's start-up against fakes: first listing, initial sync, max_lora_rank auto.

The end-to-end behaviour (real store, real engine) is in tests/test_hot_swap.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from loraserve.clients.store import ListedAdapter, Listing
from loraserve.common.errors import Unavailable
from loraserve.common.fleet.reports import ServingState
from loraserve.inference.sync import current_adapter_ranks
from loraserve.testing.fakes.sync import Harness, running
from loraserve.testing.fakes.sync_store import FakeStore, listing, manifest
from loraserve.testing.waiting import eventually


async def test_start_up_installs_each_current_revision_acks_and_watches_from_listing_seq() -> None:
    h = Harness(listing(7, ("a", 2), ("b", 1)))
    h.store.open_stream()
    async with running(h):
        await asyncio.wait_for(h.sync.initial_sync_done.wait(), 5)
        assert h.registry.current == {"a": 2, "b": 1}
        await h.reported("a", (2, {2: ServingState.LOADED}))
        await h.reported("b", (1, {1: ServingState.LOADED}))
        await eventually(lambda: h.store.watch_calls == [7], "watch from 7")
        assert h.sync.applied_seq == 7


async def test_initial_sync_done_waits_for_every_listed_adapter() -> None:
    h = Harness(listing(3, ("a", 1)))
    h.fetcher.gates[("a", 1)] = gate = asyncio.Event()
    h.store.open_stream()
    async with running(h):
        await eventually(lambda: h.fetcher.calls == [("a", 1)], "fetch started")
        assert not h.sync.initial_sync_done.is_set()
        gate.set()
        await asyncio.wait_for(h.sync.initial_sync_done.wait(), 5)


async def test_store_down_at_start_up_is_retried_until_it_lists() -> None:
    h = Harness(listing(4, ("a", 1)))
    failures = [Unavailable("down"), Unavailable("down")]
    real_list = h.store.list_adapters

    async def flaky_list(base_model: str = "") -> Listing:
        if failures:
            raise failures.pop(0)
        return await real_list(base_model)

    h.store.list_adapters = flaky_list  # type: ignore[method-assign]
    h.store.open_stream()
    async with running(h):
        await asyncio.wait_for(h.sync.initial_sync_done.wait(), 5)
        assert h.registry.current == {"a": 1}


async def test_max_lora_rank_auto_sees_the_rank_of_every_current_adapter() -> None:
    store = FakeStore(
        Listing(
            (
                ListedAdapter("a", manifest("a", 1, rank=8)),
                ListedAdapter("b", manifest("b", 3, rank=64)),
                ListedAdapter("c", None),
            ),
            5,
        )
    )
    assert sorted(await current_adapter_ranks(store, "tiny")) == [8, 64]


async def test_max_lora_rank_auto_matches_base_models_as_the_compatibility_check_does() -> None:
    def trained_on(name: str, rank: int, base_model: str) -> ListedAdapter:
        return ListedAdapter(name, replace(manifest(name, 1, rank=rank), base_model=base_model))

    store = FakeStore(
        Listing(
            (
                trained_on("by-path", 32, "/models/tiny"),
                trained_on("by-hub-id", 16, "org/tiny/"),
                trained_on("unnamed", 8, ""),
                trained_on("other-model", 64, "org/other"),
            ),
            5,
        )
    )
    assert sorted(await current_adapter_ranks(store, "tiny")) == [8, 16, 32]
    assert sorted(await current_adapter_ranks(store, "tiny", require_base_model_match=False)) == [
        8,
        16,
        32,
        64,
    ]
