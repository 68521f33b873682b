"""The adapter registry's state machine, on a fake engine: routing, make-before-break,
draining, pinning and failures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loraserve.common.errors import FailedPrecondition, NotFound
from loraserve.common.manifest import Revision
from loraserve.common.names import AdapterRef
from loraserve.inference.adapters import (
    LLAMA_TARGET_MODULES,
    AdapterRegistry,
    AdapterState,
    CompatibilityChecker,
)
from loraserve.inference.cache import CachedRevision
from loraserve.testing.inference_fakes import FakeEngine, FakeFetcher, fake_manifest, make_revision


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def fetcher(cache_dir: Path) -> FakeFetcher:
    return FakeFetcher(cache_dir)


def _registry(
    engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher | None = None, max_pinned: int = 2
) -> AdapterRegistry:
    compat = CompatibilityChecker(
        max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name="fake-llama"
    )
    return AdapterRegistry(
        engine, cache_dir=cache_dir, compat=compat, fetcher=fetcher, max_pinned=max_pinned
    )


@pytest.fixture
def registry(engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher) -> AdapterRegistry:
    return _registry(engine, cache_dir, fetcher)


def _state(registry: AdapterRegistry, name: str, revision: int) -> AdapterState | None:
    for status in registry.snapshot():
        if (status.name, status.revision) == (name, revision):
            return status.state
    return None


async def test_install_routes_name_to_the_revision(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)

    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert (lease.name, lease.revision) == ("alpha", 1)
        assert lease.adapter is not None
        assert lease.adapter.lora_name == "alpha@1"
        assert engine.loaded[lease.adapter.lora_int_id] == lease.adapter
    assert registry.current_revision("alpha") == 1


async def test_base_model_lease_has_no_adapter(registry: AdapterRegistry) -> None:
    async with registry.acquire(AdapterRef("")) as lease:
        assert (lease.name, lease.revision, lease.adapter) == ("", 0, None)


async def test_unknown_adapter_is_not_found(registry: AdapterRegistry) -> None:
    with pytest.raises(NotFound, match="ghost"):
        async with registry.acquire(AdapterRef("ghost")):
            pass


async def test_every_revision_gets_a_fresh_lora_id(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    fetcher.publish("alpha", 1)
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
    await registry.settle()
    # Revision 1 was removed; loading it again must not reuse its old id.
    await registry.set_current("alpha", 1)

    ids = [call.lora_int_id for call in engine.add_calls]
    assert len(ids) == 3
    assert len(set(ids)) == 3


async def test_new_revision_is_loaded_before_the_route_flips(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    engine.adding.clear()
    installing = asyncio.create_task(
        registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
    )
    await asyncio.sleep(0.01)

    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 1
    assert _state(registry, "alpha", 2) is AdapterState.LOADING

    engine.adding.set()
    await installing
    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 2


async def test_old_revision_drains_until_its_last_request_ends(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    old = make_revision(cache_dir, "alpha", 1)
    await registry.install(old, make_current=True)

    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.adapter is not None
        await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
        await registry.settle()
        assert _state(registry, "alpha", 1) is AdapterState.DRAINING
        assert lease.adapter.lora_int_id in engine.loaded
        assert old.path.is_dir()
    await registry.settle()

    assert lease.adapter.lora_int_id not in engine.loaded
    assert not old.path.exists()
    assert _state(registry, "alpha", 1) is None


async def test_idle_old_revision_is_removed_after_the_flip(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
    await registry.settle()

    assert [h.lora_name for h in engine.loaded.values()] == ["alpha@2"]
    assert not registry.is_installed("alpha", 1)


async def test_files_of_a_removed_revision_are_removed_by_the_cache(
    registry: AdapterRegistry, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
    await registry.settle()

    assert fetcher.removed == [("alpha", 1)]


async def test_rejected_revision_leaves_the_old_one_serving(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    engine.reject.add("alpha@2")

    with pytest.raises(FailedPrecondition, match="rejects"):
        await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)

    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 1
    failed = [s for s in registry.snapshot() if s.state is AdapterState.FAILED]
    assert [(s.revision, "rejects" in s.last_error) for s in failed] == [(2, True)]


async def test_incompatible_rank_is_refused_before_the_engine_sees_it(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    with pytest.raises(FailedPrecondition, match="rank 32"):
        await registry.install(make_revision(cache_dir, "alpha", 1, rank=32), make_current=True)
    assert engine.add_calls == []


async def test_path_outside_the_cache_is_refused(
    registry: AdapterRegistry, engine: FakeEngine, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere" / "alpha" / "1"
    outside.mkdir(parents=True)
    rev = CachedRevision(fake_manifest("alpha", 1, target_modules=("q_proj",)), outside)

    with pytest.raises(FailedPrecondition, match="not inside the adapter cache"):
        await registry.install(rev, make_current=True)
    assert engine.add_calls == []


async def test_pinned_revision_is_fetched_on_demand_and_stays_loaded(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
    fetcher.publish("alpha", 1)

    async with registry.acquire(AdapterRef("alpha", 1)) as lease:
        assert lease.revision == 1
    await registry.settle()

    assert registry.is_installed("alpha", 1)
    assert _state(registry, "alpha", 1) is AdapterState.READY
    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 2


async def test_pinned_revisions_beyond_the_lru_bound_are_removed(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    for revision in (1, 2, 3):
        fetcher.publish("alpha", revision)
        async with registry.acquire(AdapterRef("alpha", revision)):
            pass
    await registry.settle()

    assert not registry.is_installed("alpha", 1)
    assert registry.is_installed("alpha", 2)
    assert registry.is_installed("alpha", 3)
    assert sorted(h.lora_name for h in engine.loaded.values()) == ["alpha@2", "alpha@3"]


async def test_concurrent_requests_for_one_pinned_revision_load_it_once(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    fetcher.publish("alpha", 1)

    async def use() -> int:
        async with registry.acquire(AdapterRef("alpha", 1)) as lease:
            assert lease.adapter is not None
            return lease.adapter.lora_int_id

    ids = await asyncio.gather(*(use() for _ in range(5)))

    assert len(set(ids)) == 1
    assert len(engine.add_calls) == 1
    assert fetcher.fetches == [("alpha", 1)]


async def test_pinning_a_draining_revision_keeps_it_without_reloading(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    async with registry.acquire(AdapterRef("alpha")) as running:
        await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
        async with registry.acquire(AdapterRef("alpha", 1)) as pinned:
            assert pinned.adapter == running.adapter
    await registry.settle()

    assert registry.is_installed("alpha", 1)
    assert len(engine.add_calls) == 2


async def test_pinned_revision_without_a_fetcher_is_not_found(
    engine: FakeEngine, cache_dir: Path
) -> None:
    registry = _registry(engine, cache_dir, fetcher=None)
    with pytest.raises(NotFound, match="alpha@3"):
        async with registry.acquire(AdapterRef("alpha", 3)):
            pass


async def test_rollback_to_a_loaded_revision_does_not_reload_it(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=False)
    await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)

    await registry.set_current("alpha", 1)

    assert registry.current_revision("alpha") == 1
    assert len(engine.add_calls) == 2


async def test_rollback_to_a_removed_revision_fetches_it_again(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
    await registry.settle()
    fetcher.publish("alpha", 1)

    await registry.set_current("alpha", 1)

    assert fetcher.fetches == [("alpha", 1)]
    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 1


async def test_delete_unroutes_and_removes_after_in_flight_requests(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)

    async with registry.acquire(AdapterRef("alpha")):
        await registry.delete("alpha")
        with pytest.raises(NotFound):
            async with registry.acquire(AdapterRef("alpha")):
                pass
        assert engine.loaded
    await registry.settle()

    assert engine.loaded == {}
    assert registry.snapshot() == []


async def test_request_for_an_adapter_whose_first_revision_is_loading_waits_for_that_load(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    engine.adding.clear()
    installing = asyncio.create_task(
        registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    )
    await asyncio.sleep(0.01)

    async def request() -> int:
        async with registry.acquire(AdapterRef("alpha")) as lease:
            return lease.revision

    waiting = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    engine.adding.set()
    await installing

    assert await waiting == 1
    assert len(engine.add_calls) == 1


async def test_install_cancelled_mid_load_still_lands_the_load(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    engine.adding.clear()
    installing = asyncio.create_task(
        registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)
    )
    await asyncio.sleep(0.01)
    installing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await installing

    engine.adding.set()
    await registry.settle()

    assert [h.lora_name for h in engine.loaded.values()] == ["alpha@1"]
    assert registry.current_revision("alpha") == 1


async def test_snapshot_reports_current_in_flight_and_ids(
    registry: AdapterRegistry, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "beta", 1, rank=4), make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 1), make_current=True)

    async with registry.acquire(AdapterRef("beta")) as lease:
        statuses = registry.snapshot()

    assert [(s.name, s.revision, s.state, s.current) for s in statuses] == [
        ("alpha", 1, AdapterState.READY, True),
        ("beta", 1, AdapterState.READY, True),
    ]
    assert lease.adapter is not None
    assert (statuses[1].in_flight, statuses[1].rank) == (1, 4)
    assert statuses[1].lora_int_id == lease.adapter.lora_int_id


async def test_delete_while_a_pinned_revision_loads_discards_it_and_the_request_is_not_found(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 2), make_current=True)
    fetched = asyncio.Event()
    go_on = asyncio.Event()
    fetch = fetcher.fetch

    async def held_fetch(
        name: str, revision: int, manifest: Revision | None = None
    ) -> CachedRevision:
        rev = await fetch(name, revision, manifest)
        fetched.set()
        await go_on.wait()
        return rev

    fetcher.fetch = held_fetch  # type: ignore[method-assign]
    fetcher.publish("alpha", 1)

    async def use_pinned() -> None:
        async with registry.acquire(AdapterRef("alpha", 1)):
            pass

    request = asyncio.ensure_future(use_pinned())
    await fetched.wait()
    await registry.delete("alpha")
    go_on.set()

    with pytest.raises(NotFound, match="alpha@1 was deleted"):
        await request
    await registry.settle()
    assert not registry.is_installed("alpha", 1)
    assert [h.lora_name for h in engine.add_calls] == ["alpha@2"]
    assert not (cache_dir / "alpha" / "1").exists()
    assert registry.snapshot() == []


async def test_failed_load_leaves_no_files(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    rev = make_revision(cache_dir, "alpha", 1, rank=64)

    with pytest.raises(FailedPrecondition):
        await registry.install(rev, make_current=True)

    assert not rev.path.exists()
