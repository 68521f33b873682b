"""What inference replicas report, in batches (issue 25, item 1): a bounded number of
objects however many adapters, every live replica listed for every adapter, stale and
expired replicas told apart; on the in-memory blob store."""

from __future__ import annotations

from loraserve.adapterstore.replicas.model import Liveness, ReplicaReport, Shard
from loraserve.adapterstore.replicas.ops import StatusPage
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.fleet.reports import AdapterReport, RevisionReport, ServingState
from loraserve.common.statusshards import STATUS_SHARDS, shard_of
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.store.stores import StoreFactory
from loraserve.testing.waiting import eventually


def report(replica: str, names: list[str], interval_s: float = 60.0) -> ReplicaReport:
    """Every shard of `replica`, routing revision 1 of each of `names`."""
    shards: dict[int, list[AdapterReport]] = {i: [] for i in range(STATUS_SHARDS)}
    for name in names:
        entry = AdapterReport(name, 1, (RevisionReport(1, ServingState.ROUTED),))
        shards[shard_of(name)].append(entry)
    return ReplicaReport(
        replica, 5, "", interval_s, tuple(Shard(i, tuple(a)) for i, a in shards.items())
    )


async def statuses(store: AdapterStore, name: str = "") -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []
    token = ""
    while True:
        page: StatusPage = await store.replicas.page(name, 0, token, lambda s: 100)
        found.extend((s.adapter_name, s.replica_id, s.liveness.value) for s in page.statuses)
        token = page.next_page_token
        if not token:
            return found


async def test_replicas_routing_2000_adapters_keep_at_most_17_objects_each(
    memory_blobs: MemoryBlobStore, memory_store: AdapterStore
) -> None:
    names = [f"a{i:04d}" for i in range(2000)]
    for name in names:
        await push(memory_store, name, tiny_adapter())
    for replica in ("r1", "r2", "r3"):
        assert await memory_store.replicas.report(report(replica, names)) is False
    keys = [k for k in memory_blobs.objects if k.startswith(("fleet/", "replicas/"))]
    assert len(keys) <= 3 * (STATUS_SHARDS + 1)
    found = await statuses(memory_store, "a0123")
    assert found == [("a0123", r, "live") for r in ("r1", "r2", "r3")]


async def test_a_second_report_of_a_live_replica_is_known(memory_store: AdapterStore) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    assert await memory_store.replicas.report(report("r1", ["alpha"])) is False
    assert await memory_store.replicas.report(report("r1", ["alpha"])) is True


async def test_every_live_replica_is_listed_even_without_a_report_of_the_adapter(
    memory_store: AdapterStore,
) -> None:
    for name in ("alpha", "beta"):
        await push(memory_store, name, tiny_adapter())
    await memory_store.replicas.report(report("r1", ["alpha", "beta"]))
    await memory_store.replicas.report(report("r2", ["alpha"]))
    page = await memory_store.replicas.page("beta", 0, "", lambda s: 100)
    assert [(s.replica_id, s.report is not None) for s in page.statuses] == [
        ("r1", True),
        ("r2", False),
    ]


async def test_statuses_of_adapters_the_store_does_not_hold_are_dropped(
    memory_store: AdapterStore,
) -> None:
    await push(memory_store, "alpha", tiny_adapter())
    await memory_store.replicas.report(report("r1", ["alpha", "ghost"]))
    assert await statuses(memory_store) == [("alpha", "r1", "live")]


async def test_all_adapters_page_by_adapter_then_replica(memory_store: AdapterStore) -> None:
    names = ["a", "b", "c"]
    for name in names:
        await push(memory_store, name, tiny_adapter())
    for replica in ("r1", "r2"):
        await memory_store.replicas.report(report(replica, names))
    pages = []
    token = ""
    while True:
        page = await memory_store.replicas.page("", 4, token, lambda s: 100)
        pages.append([(s.adapter_name, s.replica_id) for s in page.statuses])
        token = page.next_page_token
        if not token:
            break
    assert pages == [
        [("a", "r1"), ("a", "r2"), ("b", "r1"), ("b", "r2")],
        [("c", "r1"), ("c", "r2")],
    ]


async def test_a_replica_that_missed_two_reports_is_stale_then_expires(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    store = await open_store(memory_blobs, status_ttl_s=1.0)
    await push(store, "alpha", tiny_adapter())
    await store.replicas.report(report("quiet", ["alpha"], interval_s=0.05))
    await store.replicas.report(report("busy", ["alpha"], interval_s=60.0))

    async def liveness() -> dict[str, str]:
        return {replica: live for _, replica, live in await statuses(store, "alpha")}

    async def quiet_is(state: str | None) -> bool:
        return (await liveness()).get("quiet") == state

    await eventually(lambda: quiet_is(Liveness.STALE.value), "the quiet replica shows as stale")
    await eventually(lambda: quiet_is(None), "the quiet replica expires")
    assert not [k for k in memory_blobs.objects if "quiet" in k]
