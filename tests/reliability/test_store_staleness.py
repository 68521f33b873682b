"""A store replica that stops advancing: health says so, its poller survives, and an
inference sync watching it moves to a replica that still sees new commits.

Stores run in-process over real gRPC; each reaches the moto S3 server through its
own fault proxy, whose stalled requests stand in for a store cut off from S3.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from grpc_health.v1 import health_pb2

from loraserve.adapterstore.blobs.s3blobs import S3BlobStore
from loraserve.clients.store import RolloutSplit, StoreClient, StoreClientSettings
from loraserve.common.fleet.reports import AdapterReport, RevisionReport, ServingState
from loraserve.common.revisions.manifest import Revision
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.adapters import RegistryCounts
from loraserve.inference.sync import Synchronizer, SyncSettings
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.processes.services import health_status, wait_for_health
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, S3FaultProxy, s3_fault_proxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.waiting import GUARD_S, eventually

pytestmark = pytest.mark.faults

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
# Small enough that a stalled store turns stale within the test's patience.
FAST_STALENESS: dict[str, Any] = {"max_staleness_s": 2.0, "heartbeat_interval": 0.2}


@asynccontextmanager
async def proxied_store(bucket: S3Bucket) -> AsyncIterator[tuple[RunningStore, S3FaultProxy]]:
    """A fast-staleness store that reaches `bucket` only through its own fault proxy."""
    port = urlsplit(bucket.endpoint_url).port
    assert port is not None
    async with s3_fault_proxy(port) as proxy:
        proxied = replace(bucket, endpoint_url=proxy.endpoint_url)
        async with running_store(proxied, None, **FAST_STALENESS) as store:
            yield store, proxy


def cut_off(fault_proxy: S3FaultProxy) -> None:
    """Every S3 request of the store from now on hangs, as behind a dead network."""
    for method in ("GET", "PUT", "HEAD", "DELETE", "POST"):
        fault_proxy.add(Fault.STALL, method, "")


def reconnect(fault_proxy: S3FaultProxy) -> None:
    fault_proxy.clear()
    fault_proxy.release()


async def test_store_cut_off_from_s3_turns_not_serving_and_back(s3_bucket: S3Bucket) -> None:
    async with proxied_store(s3_bucket) as (store, proxy):
        await wait_for_health(store.address, SERVING, guard_s=GUARD_S)
        cut_off(proxy)
        await wait_for_health(store.address, NOT_SERVING, guard_s=GUARD_S)
        reconnect(proxy)
        await wait_for_health(store.address, SERVING, guard_s=GUARD_S)


async def test_unexpected_poller_error_does_not_stop_the_poller(
    s3_bucket: S3Bucket, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_store(s3_bucket) as watched, running_store(s3_bucket) as other:
        failures = 3
        real_get = S3BlobStore.get

        async def flaky_get(self: S3BlobStore, key: str) -> bytes:
            nonlocal failures
            if failures and key.startswith("log/"):
                failures -= 1
                raise RuntimeError("injected: a bug deep in the poll")
            return await real_get(self, key)

        monkeypatch.setattr(S3BlobStore, "get", flaky_get)
        await eventually(lambda: failures == 0, "the injected errors were raised", GUARD_S)
        monkeypatch.setattr(S3BlobStore, "get", real_get)
        async with store_stub(other.address) as stub:
            pushed = await push(stub, "after-bug", tiny_adapter())
        # Only the poller moves a replica's head without a call to it.
        await eventually(
            lambda: watched.store.head_seq >= pushed.seq,
            "the replica whose poller failed saw a commit made elsewhere",
            GUARD_S,
        )
        assert watched.store.fresh
        assert await health_status(watched.address) == SERVING


async def test_store_whose_poller_stopped_is_not_serving(s3_bucket: S3Bucket) -> None:
    async with running_store(s3_bucket) as store:
        await wait_for_health(store.address, SERVING, guard_s=GUARD_S)
        # Closing the store stops its poller, as a poller that could not go on would.
        await store.store.close()
        await wait_for_health(store.address, NOT_SERVING, guard_s=GUARD_S)


class _Registry:
    """Routes whatever sync asks for; loads nothing."""

    def __init__(self) -> None:
        self.current: dict[str, int] = {}

    async def install(self, manifest: Revision, *, make_current: bool) -> None:
        if make_current:
            self.current[manifest.adapter_name] = manifest.revision

    async def set_current(self, name: str, revision: int) -> None:
        self.current[name] = revision

    async def delete(self, name: str) -> None:
        self.current.pop(name, None)

    def current_revision(self, name: str) -> int | None:
        return self.current.get(name)

    def is_loaded(self, name: str, revision: int) -> bool:
        return self.current.get(name) == revision

    def uses_files(self, name: str, revision: int) -> bool:
        return self.is_loaded(name, revision)

    def set_target(self, manifest: Revision) -> None:
        self.current[manifest.adapter_name] = manifest.revision

    def target_revision(self, name: str) -> int | None:
        return self.current.get(name)

    def is_resident(self, name: str) -> bool:
        return name in self.current

    def counts(self) -> RegistryCounts:
        routed = len(self.current)
        return RegistryCounts(routed=routed, resident=routed, loaded=routed, in_slots=0)

    def held(self) -> dict[str, int]:
        # Revision seqs are not kept: nothing is ever taken for a deleted generation.
        return {}

    def mark_failed(self, manifest: Revision, error: Exception) -> None:
        raise AssertionError(f"{manifest.key} failed: {error}")

    def set_rollout(self, name: str, split: RolloutSplit) -> None:
        raise AssertionError(f"no rollout expected of {name}")

    def end_rollout(self, name: str) -> None:
        pass

    async def install_candidate(self, name: str) -> None:
        raise AssertionError(f"no rollout expected of {name}")

    def split_of(self, name: str) -> RolloutSplit | None:
        return None

    def report(self, name: str) -> AdapterReport | None:
        revision = self.current.get(name)
        if revision is None:
            return None
        return AdapterReport(name, revision, (RevisionReport(revision, ServingState.LOADED),))

    def names(self) -> set[str]:
        return set(self.current)


async def test_sync_watching_a_store_that_stops_advancing_moves_to_a_healthy_one(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(proxied_store(s3_bucket)) for _ in range(2)]
        for store, _ in stores:
            await wait_for_health(store.address, SERVING, guard_s=GUARD_S)
        client = StoreClient.connect(
            StoreClientSettings(
                address="ipv4:" + ",".join(store.address for store, _ in stores),
                security=ClientSecurity(),
                replica_id="inference-0",
                idle_timeout_s=GUARD_S,
                max_staleness_s=FAST_STALENESS["max_staleness_s"],
            )
        )
        stack.push_async_callback(client.close)
        registry = _Registry()
        sync = Synchronizer(
            client, registry, settings=SyncSettings(initial_backoff_s=0.05, max_backoff_s=0.5)
        )
        task = asyncio.create_task(sync.run())
        stack.push_async_callback(_cancelled, task)
        await asyncio.wait_for(sync.initial_sync_done.wait(), GUARD_S)
        await eventually(
            lambda: sum(store.store.watch_count for store, _ in stores) == 1,
            "the sync watches one store",
            GUARD_S,
        )
        (_, stale_proxy), (healthy, _) = sorted(stores, key=lambda pair: -pair[0].store.watch_count)
        cut_off(stale_proxy)
        async with store_stub(healthy.address) as stub:
            pushed = await push(stub, "pushed-elsewhere", tiny_adapter())
        await eventually(
            lambda: registry.current.get("pushed-elsewhere") == pushed.revision.revision,
            "the sync received the push made through the healthy store",
            GUARD_S,
        )
        await eventually(
            lambda: healthy.store.watch_count == 1, "the sync watches the healthy store", GUARD_S
        )
        reconnect(stale_proxy)


async def _cancelled(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
