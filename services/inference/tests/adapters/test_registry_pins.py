"""The adapter registry's pinned revisions (`NAME@REV`), rollbacks and deletes, on a fake
engine; and what the pin policy serves (issue 54, item 5): the policy, the caller's
role, yanked revisions, and pins that cannot push out a pin another caller uses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from loraserve.clients.store import RolloutSplit
from loraserve.common.config.pins import PinPolicy, PinSettings
from loraserve.common.errors import (
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.common.revisions.names import AdapterRef
from loraserve.common.rpc.security import Role, current_role
from loraserve.inference.adapters import AdapterRegistry, RevisionLife
from loraserve.inference.cache import CachedRevision, Holder
from loraserve.testing.fakes.clock import ManualClock
from loraserve.testing.fakes.engine import (
    CacheDirectory,
    FakeEngine,
    FakeFetcher,
    fake_manifest,
    make_revision,
)
from loraserve.testing.fakes.registry import fake_registry, state_of


async def test_pinned_revision_is_fetched_on_demand_and_stays_loaded(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    fetcher.publish("alpha", 1)

    async with registry.acquire(AdapterRef("alpha", 1)) as lease:
        assert lease.revision == 1
    await registry.wait_background()

    assert registry.is_loaded("alpha", 1)
    assert state_of(registry, "alpha", 1) is RevisionLife.READY
    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 2


async def test_pinned_revisions_beyond_the_lru_bound_are_removed(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    for revision in (1, 2, 3):
        fetcher.publish("alpha", revision)
        async with registry.acquire(AdapterRef("alpha", revision)):
            pass
    await registry.wait_background()

    assert not registry.is_loaded("alpha", 1)
    assert registry.is_loaded("alpha", 2)
    assert registry.is_loaded("alpha", 3)
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
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    async with registry.acquire(AdapterRef("alpha")) as running:
        await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
        async with registry.acquire(AdapterRef("alpha", 1)) as pinned:
            assert pinned.adapter == running.adapter
    await registry.wait_background()

    assert registry.is_loaded("alpha", 1)
    assert len(engine.add_calls) == 2


async def test_pinned_revision_that_cannot_be_fetched_is_not_found(
    engine: FakeEngine, cache_dir: Path
) -> None:
    registry = fake_registry(engine, CacheDirectory(cache_dir))
    with pytest.raises(NotFound, match="alpha@3"):
        async with registry.acquire(AdapterRef("alpha", 3)):
            pass


async def test_rollback_to_a_loaded_revision_does_not_reload_it(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=False)
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)

    await registry.set_current("alpha", 1)

    assert registry.current_revision("alpha") == 1
    assert len(engine.add_calls) == 2


async def test_rollback_to_a_removed_revision_fetches_it_again(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    await registry.wait_background()
    fetcher.publish("alpha", 1)

    await registry.set_current("alpha", 1)

    assert fetcher.fetches == [("alpha", 1)]
    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 1


async def test_delete_unroutes_and_removes_after_in_flight_requests(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)

    async with registry.acquire(AdapterRef("alpha")):
        await registry.delete("alpha")
        with pytest.raises(NotFound):
            async with registry.acquire(AdapterRef("alpha")):
                pass
        assert engine.loaded
    await registry.wait_background()

    assert engine.loaded == {}
    assert registry.snapshot() == []


async def test_delete_while_a_pinned_revision_loads_discards_it_and_the_request_is_not_found(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    fetched = asyncio.Event()
    go_on = asyncio.Event()
    fetch = fetcher.fetch

    async def held_fetch(
        name: str, revision: int, manifest: Revision | None = None, *, holder: Holder | None = None
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
    await registry.wait_background()
    assert not registry.is_loaded("alpha", 1)
    assert [h.lora_name for h in engine.add_calls] == ["alpha@2"]
    assert not (cache_dir / "alpha" / "1").exists()
    assert registry.snapshot() == []


async def _pinned(registry: AdapterRegistry, name: str, revision: int) -> int:
    async with registry.acquire(AdapterRef(name, revision)) as lease:
        return lease.revision


def _with_policy(
    engine: FakeEngine, fetcher: FakeFetcher, policy: PinPolicy, **options: Any
) -> AdapterRegistry:
    return fake_registry(engine, fetcher, pins=PinSettings(policy), **options)


async def test_rollout_policy_refuses_a_pin_of_a_rolled_back_revision_before_loading_it(
    engine: FakeEngine, fetcher: FakeFetcher, cache_dir: Path
) -> None:
    registry = _with_policy(engine, fetcher, PinPolicy.ROLLOUT)
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    fetcher.publish("alpha", 1)

    with pytest.raises(FailedPrecondition, match=r"alpha@1 is neither .* pin policy 'rollout'"):
        await _pinned(registry, "alpha", 1)

    assert fetcher.fetches == []
    assert [h.lora_name for h in engine.add_calls] == ["alpha@2"]


async def test_rollout_policy_serves_the_current_revision_pinned_without_holding_it_longer(
    engine: FakeEngine, fetcher: FakeFetcher, cache_dir: Path
) -> None:
    registry = _with_policy(engine, fetcher, PinPolicy.ROLLOUT)
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)

    assert await _pinned(registry, "alpha", 1) == 1
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    await registry.wait_background()

    assert not registry.is_loaded("alpha", 1)


async def test_rollout_policy_serves_an_active_rollouts_candidate_pinned(
    engine: FakeEngine, fetcher: FakeFetcher, cache_dir: Path
) -> None:
    registry = _with_policy(engine, fetcher, PinPolicy.ROLLOUT)
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    fetcher.publish("alpha", 2)
    registry.set_rollout("alpha", RolloutSplit(fake_manifest("alpha", 2), 0.0, 5))

    assert await _pinned(registry, "alpha", 2) == 2


async def test_a_caller_whose_token_is_not_a_pinners_may_not_pin(
    registry: AdapterRegistry, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    reader = current_role.set(Role.READER)
    try:
        with pytest.raises(PermissionDenied, match="pinning needs a pinner token"):
            await _pinned(registry, "alpha", 1)
        current_role.set(Role.PINNER)
        assert await _pinned(registry, "alpha", 1) == 1
    finally:
        current_role.reset(reader)


async def test_off_policy_refuses_every_pin_naming_the_policy(
    engine: FakeEngine, fetcher: FakeFetcher, cache_dir: Path
) -> None:
    registry = _with_policy(engine, fetcher, PinPolicy.OFF)
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)

    with pytest.raises(PermissionDenied, match=r"alpha@1: .*pin policy 'off'"):
        await _pinned(registry, "alpha", 1)


async def test_a_yanked_revision_is_refused_pinned_with_the_stores_reason(
    registry: AdapterRegistry, fetcher: FakeFetcher, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    fetcher.publish("alpha", 1)
    registry.set_yanks({RevisionKey("alpha", 1): "leaks the system prompt"})

    with pytest.raises(FailedPrecondition, match="alpha@1 is yanked: leaks the system prompt"):
        await _pinned(registry, "alpha", 1)
    assert fetcher.fetches == []


async def test_a_pinned_revision_that_is_yanked_leaves_the_engine(
    registry: AdapterRegistry, fetcher: FakeFetcher, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    fetcher.publish("alpha", 1)
    assert await _pinned(registry, "alpha", 1) == 1

    registry.set_yanks({RevisionKey("alpha", 1): "bad"})
    await registry.wait_background()

    assert not registry.is_loaded("alpha", 1)
    assert registry.is_loaded("alpha", 2)


async def test_a_pin_used_within_the_idle_time_is_not_evicted_by_another_callers_pin(
    engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    clock = ManualClock(0.0)
    pins = PinSettings(PinPolicy.ANY, idle_s=60, max_pinned=2)
    registry = fake_registry(engine, fetcher, pins=pins, clock=clock)
    for revision in (1, 2, 3):
        fetcher.publish("alpha", revision)
    await _pinned(registry, "alpha", 1)
    await _pinned(registry, "alpha", 2)

    with pytest.raises(ResourceExhausted, match="places for pinned revisions"):
        await _pinned(registry, "alpha", 3)
    assert (registry.is_loaded("alpha", 1), registry.is_loaded("alpha", 2)) == (True, True)
    assert ("alpha", 3) not in fetcher.fetches

    clock.now = 60.0
    assert await _pinned(registry, "alpha", 3) == 3
    await registry.wait_background()
    assert [registry.is_loaded("alpha", r) for r in (1, 2, 3)] == [False, True, True]
