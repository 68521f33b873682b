"""The registry's lazy residency: names routed to a target load it on their first
request, once however many requests ask; the cache evicts only what nothing holds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loraserve.common.errors import FailedPrecondition, NotFound
from loraserve.common.revisions.manifest import RevisionKey
from loraserve.common.revisions.names import AdapterRef, parse_adapter_ref
from loraserve.inference.adapters import (
    AdapterRegistry,
    RevisionLife,
    Tier,
)
from loraserve.inference.adapters.state import RevisionEntry
from loraserve.testing.fakes.engine import FakeEngine, FakeFetcher, fake_manifest
from loraserve.testing.waiting import eventually


@pytest.fixture
def fetcher(cache_dir: Path) -> FakeFetcher:
    fetcher = FakeFetcher(cache_dir)
    for revision in (1, 2):
        fetcher.publish("alpha", revision)
    return fetcher


async def serve(registry: AdapterRegistry, ref: str) -> int:
    async with registry.acquire(parse_adapter_ref(ref)) as lease:
        return lease.revision


async def until_fetching(fetcher: FakeFetcher) -> None:
    await eventually(lambda: bool(fetcher.fetches), "a fetch started")


async def test_first_request_loads_the_target_and_routes_it(
    registry: AdapterRegistry, engine: FakeEngine
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    assert registry.current_revision("alpha") is None

    assert await serve(registry, "alpha") == 1

    assert registry.current_revision("alpha") == 1
    assert [h.lora_name for h in engine.add_calls] == ["alpha@1"]


async def test_concurrent_first_requests_share_one_load(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    fetcher.gate.clear()
    requests = [asyncio.create_task(serve(registry, "alpha")) for _ in range(16)]
    await until_fetching(fetcher)
    fetcher.gate.set()

    assert await asyncio.gather(*requests) == [1] * 16
    assert fetcher.fetches == [("alpha", 1)]
    assert len(engine.add_calls) == 1


async def test_request_that_gives_up_leaves_the_load_to_finish(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    fetcher.gate.clear()
    request = asyncio.create_task(serve(registry, "alpha"))
    await until_fetching(fetcher)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    fetcher.gate.set()
    await registry.wait_background()

    assert registry.current_revision("alpha") == 1
    assert await serve(registry, "alpha") == 1
    assert len(engine.add_calls) == 1


async def test_delete_during_a_load_on_miss_fails_the_request_and_keeps_nothing(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    fetcher.gate.clear()
    request = asyncio.create_task(serve(registry, "alpha"))
    await until_fetching(fetcher)
    await registry.delete("alpha")
    fetcher.gate.set()

    with pytest.raises(NotFound, match="deleted"):
        await request
    await registry.wait_background()
    assert engine.loaded == {}
    assert registry.snapshot() == []
    assert not (fetcher.cache_dir / "alpha" / "1").exists()


async def test_newer_target_during_a_load_on_miss_serves_the_newer_revision(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    fetcher.gate.clear()
    request = asyncio.create_task(serve(registry, "alpha"))
    await until_fetching(fetcher)
    registry.set_target(fake_manifest("alpha", 2))
    fetcher.gate.set()

    assert await request == 2
    await registry.wait_background()
    assert registry.current_revision("alpha") == 2
    assert [h.lora_name for h in engine.loaded.values()] == ["alpha@2"]
    assert not (fetcher.cache_dir / "alpha" / "1").exists()


async def test_release_takes_an_idle_routed_revision_out_and_the_next_request_reloads_it(
    registry: AdapterRegistry, engine: FakeEngine
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    await serve(registry, "alpha")

    assert await registry.release("alpha", 1)

    assert engine.loaded == {}
    assert registry.current_revision("alpha") is None
    assert registry.target_revision("alpha") == 1
    assert await serve(registry, "alpha") == 1
    assert len(engine.add_calls) == 2


async def test_release_refuses_a_revision_running_requests(
    registry: AdapterRegistry, engine: FakeEngine
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    async with registry.acquire(AdapterRef("alpha")):
        assert not await registry.release("alpha", 1)
    assert registry.current_revision("alpha") == 1
    assert len(engine.loaded) == 1


async def test_release_refuses_a_pinned_revision(
    registry: AdapterRegistry, engine: FakeEngine
) -> None:
    await serve(registry, "alpha@2")

    assert not await registry.release("alpha", 2)
    assert len(engine.loaded) == 1


async def test_release_refuses_a_revision_still_loading(
    registry: AdapterRegistry, fetcher: FakeFetcher
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    fetcher.gate.clear()
    request = asyncio.create_task(serve(registry, "alpha"))
    await until_fetching(fetcher)

    assert not await registry.release("alpha", 1)
    fetcher.gate.set()
    assert await request == 1


async def test_target_the_engine_cannot_serve_is_refused_from_its_manifest(
    registry: AdapterRegistry, fetcher: FakeFetcher
) -> None:
    with pytest.raises(FailedPrecondition, match="rank 32"):
        registry.set_target(fake_manifest("alpha", 1, rank=32))

    assert registry.target_revision("alpha") is None
    assert fetcher.fetches == []


async def test_new_target_takes_the_route_from_a_loaded_older_revision(
    registry: AdapterRegistry, engine: FakeEngine
) -> None:
    registry.set_target(fake_manifest("alpha", 1))
    await serve(registry, "alpha")

    registry.set_target(fake_manifest("alpha", 2))
    await registry.wait_background()

    assert registry.current_revision("alpha") is None
    assert engine.loaded == {}
    assert await serve(registry, "alpha") == 2


async def test_snapshot_lists_a_target_not_loaded_as_available_in_its_tier(
    registry: AdapterRegistry,
) -> None:
    registry.set_target(fake_manifest("alpha", 1))

    [status] = registry.snapshot()

    assert (status.state, status.current, status.tier) == (
        RevisionLife.AVAILABLE,
        True,
        Tier.STORE,
    )


def test_a_landed_revision_whose_requests_have_not_run_yet_is_not_released() -> None:
    entry = RevisionEntry(RevisionKey("alpha", 1), RevisionLife.READY, waiters=1)

    assert not entry.releasable
