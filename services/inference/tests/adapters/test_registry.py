"""The adapter registry's state machine on a fake engine: routing, make-before-break,
draining and failures (pins, rollbacks and deletes: test_registry_pins.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loraserve.common.errors import FailedPrecondition, NotFound, Unavailable
from loraserve.common.fleet.reports import ServingState
from loraserve.common.revisions.manifest import Revision
from loraserve.common.revisions.names import AdapterRef
from loraserve.inference.adapters import AdapterRegistry, RevisionLife
from loraserve.inference.cache import CachedRevision, Holder
from loraserve.testing.fakes.engine import (
    CacheDirectory,
    FakeEngine,
    FakeFetcher,
    fake_manifest,
    make_revision,
)
from loraserve.testing.fakes.registry import fake_registry, state_of
from loraserve.testing.waiting import eventually


def _adding(engine: FakeEngine, lora_name: str) -> bool:
    """Whether the engine was asked to load `lora_name` (and, `adding` cleared, holds it
    there)."""
    return any(call.lora_name == lora_name for call in engine.add_calls)


async def test_install_routes_name_to_the_revision(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)

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
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    await registry.wait_background()
    # Revision 1 was removed; loading it again must not reuse its old id.
    await registry.set_current("alpha", 1)

    ids = [call.lora_int_id for call in engine.add_calls]
    assert len(ids) == 3
    assert len(set(ids)) == 3


async def test_new_revision_is_loaded_before_the_route_flips(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    engine.adding.clear()
    installing = asyncio.create_task(
        registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    )
    await eventually(lambda: _adding(engine, "alpha@2"), "the engine is loading alpha@2")

    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 1
    assert state_of(registry, "alpha", 2) is RevisionLife.LOADING

    engine.adding.set()
    await installing
    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 2


async def test_old_revision_drains_until_its_last_request_ends(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    old = make_revision(cache_dir, "alpha", 1)
    await registry.install(old.manifest, make_current=True)

    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.adapter is not None
        await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
        await registry.wait_background()
        assert state_of(registry, "alpha", 1) is RevisionLife.DRAINING
        assert lease.adapter.lora_int_id in engine.loaded
        assert old.path.is_dir()
    await registry.wait_background()

    assert lease.adapter.lora_int_id not in engine.loaded
    assert not old.path.exists()
    assert state_of(registry, "alpha", 1) is None


async def test_idle_old_revision_is_removed_after_the_flip(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    await registry.wait_background()

    assert [h.lora_name for h in engine.loaded.values()] == ["alpha@2"]
    assert not registry.is_loaded("alpha", 1)


async def test_files_of_a_removed_revision_are_removed_by_the_cache(
    registry: AdapterRegistry, cache_dir: Path, fetcher: FakeFetcher
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)
    await registry.wait_background()

    assert fetcher.removed == [("alpha", 1)]


async def test_rejected_revision_leaves_the_old_one_serving(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    engine.reject.add("alpha@2")

    with pytest.raises(FailedPrecondition, match="rejects"):
        await registry.install(make_revision(cache_dir, "alpha", 2).manifest, make_current=True)

    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 1
    failed = [s for s in registry.snapshot() if s.state is RevisionLife.FAILED]
    assert [(s.revision, "rejects" in s.last_error) for s in failed] == [(2, True)]


async def test_incompatible_rank_is_refused_before_the_engine_sees_it(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    with pytest.raises(FailedPrecondition, match="rank 32"):
        await registry.install(
            make_revision(cache_dir, "alpha", 1, rank=32).manifest, make_current=True
        )
    assert engine.add_calls == []


class _CacheGivingAPathOutside(CacheDirectory):
    def __init__(self, cache_dir: Path, outside: Path) -> None:
        super().__init__(cache_dir)
        self.outside = outside

    async def fetch(
        self,
        name: str,
        revision: int,
        manifest: Revision | None = None,
        *,
        holder: Holder | None = None,
    ) -> CachedRevision:
        assert manifest is not None
        return CachedRevision(manifest, self.outside)


async def test_path_outside_the_cache_is_refused(
    engine: FakeEngine, cache_dir: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere" / "alpha" / "1"
    outside.mkdir(parents=True)
    registry = fake_registry(engine, _CacheGivingAPathOutside(cache_dir, outside))

    with pytest.raises(FailedPrecondition, match="not inside the adapter cache"):
        await registry.install(
            fake_manifest("alpha", 1, target_modules=("q_proj",)), make_current=True
        )
    assert engine.add_calls == []


async def test_request_for_an_adapter_whose_first_revision_is_loading_waits_for_that_load(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    engine.adding.clear()
    installing = asyncio.create_task(
        registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    )
    await eventually(lambda: _adding(engine, "alpha@1"), "the engine is loading alpha@1")

    async def request() -> int:
        async with registry.acquire(AdapterRef("alpha")) as lease:
            return lease.revision

    waiting = asyncio.create_task(request())
    # The behaviour itself: while the load is held, the request gets no answer (nothing
    # to wait on for that but time; a request refused at once would be done by now).
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
        registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    )
    await eventually(lambda: _adding(engine, "alpha@1"), "the engine is loading alpha@1")
    installing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await installing

    engine.adding.set()
    await registry.wait_background()

    assert [h.lora_name for h in engine.loaded.values()] == ["alpha@1"]
    assert registry.current_revision("alpha") == 1


async def test_snapshot_reports_current_in_flight_and_ids(
    registry: AdapterRegistry, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "beta", 1, rank=4).manifest, make_current=True)
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)

    async with registry.acquire(AdapterRef("beta")) as lease:
        statuses = registry.snapshot()

    assert [(s.name, s.revision, s.state, s.current) for s in statuses] == [
        ("alpha", 1, RevisionLife.READY, True),
        ("beta", 1, RevisionLife.READY, True),
    ]
    assert lease.adapter is not None
    assert (statuses[1].in_flight, statuses[1].rank) == (1, 4)
    assert statuses[1].lora_int_id == lease.adapter.lora_int_id


async def test_failed_load_leaves_no_files(
    registry: AdapterRegistry, engine: FakeEngine, cache_dir: Path
) -> None:
    rev = make_revision(cache_dir, "alpha", 1, rank=64)

    with pytest.raises(FailedPrecondition):
        await registry.install(rev.manifest, make_current=True)

    assert not rev.path.exists()


async def test_revision_whose_load_failed_for_now_is_reported_loading_while_the_old_one_serves(
    registry: AdapterRegistry, fetcher: FakeFetcher, cache_dir: Path
) -> None:
    await registry.install(make_revision(cache_dir, "alpha", 1).manifest, make_current=True)
    # Not published, and the fetch is cut: sync retries it later.
    fetcher.download = _unavailable  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        await registry.install(fake_manifest("alpha", 2), make_current=True)

    report = registry.report("alpha")
    assert report is not None
    assert report.serving_revision == 1
    assert {r.revision: r.state for r in report.revisions} == {
        1: ServingState.LOADED,
        2: ServingState.LOADING,
    }
    async with registry.acquire(AdapterRef("alpha")) as lease:
        assert lease.revision == 1


async def _unavailable(name: str, revision: int, manifest: Revision | None) -> CachedRevision:
    raise Unavailable(f"download of {name}@{revision} was cut")
