"""Thousands of adapters per replica, on real parts: start-up loads a bounded prefetch
set and only routes the rest; the first request for any other adapter loads it
(once, however many ask, within the request's deadline, following a newer revision
and failing cleanly on a delete); the disk cache stays under its bound; a restart
prefetches what the replica served most recently.

Real parts: the store's gRPC server over S3 on HTTP through the S3 fault proxy (which
holds blob downloads where a test needs a load in flight), and the whole inference
app on the session's vLLM engine.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import RunningInference, adapter_files, greedy, inference_app
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.calls import rpc_code as code_of
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import GUARD_S, eventually
from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

WEIGHTS = "adapter_model.safetensors"
PROMPT = (5, 17, 42, 99, 3, 250, 7, 64)
NAMES = ("a", "b", "c", "d")


class Tiers:
    """Four adapters (tiny adapter seeds 1-4) pushed to a store behind the S3 fault proxy."""

    def __init__(
        self,
        store: RunningStore,
        fault_proxy: S3FaultProxy,
        files: dict[str, AdapterFiles],
        dirs: dict[str, Path],
        llm: AsyncLLM,
        model_dir: Path,
        cache: Path,
    ) -> None:
        self.store, self.proxy, self.files, self.dirs = store, fault_proxy, files, dirs
        self.llm, self.model_dir, self.cache = llm, model_dir, cache

    @property
    def adapter_bytes(self) -> int:
        return sum(len(data) for data in self.files["a"].values())

    def weight_gets(self, name: str) -> int:
        key = blob_key(hashlib.sha256(self.files[name][WEIGHTS]).hexdigest())
        return self.proxy.requests.count(("GET", key))

    def stall(self, name: str) -> Any:
        key = blob_key(hashlib.sha256(self.files[name][WEIGHTS]).hexdigest())
        return self.proxy.add(Fault.STALL, "GET", key)

    async def push(self, name: str, files: AdapterFiles) -> int:
        async with store_stub(self.store.address) as stub:
            response = await push(stub, name, files)
        return int(response.revision.revision)

    async def delete(self, name: str) -> None:
        async with store_stub(self.store.address) as stub:
            await stub.DeleteAdapter(store_pb.DeleteAdapterRequest(name=name))

    @asynccontextmanager
    async def replica(self, *flags: str) -> AsyncIterator[RunningInference]:
        async with inference_app(
            self.llm,
            model_dir=self.model_dir,
            store_address=self.store.address,
            cache_dir=self.cache,
            replica_id="tiers-replica",
            extra=flags,
        ) as inference:
            yield inference


@pytest.fixture
async def tiers(
    proxied_store: RunningStore,
    fault_proxy: S3FaultProxy,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
) -> Tiers:
    dirs = {name: tiny_adapter(seed=seed) for seed, name in enumerate(NAMES, start=1)}
    files = {name: adapter_files(path) for name, path in dirs.items()}
    async with store_stub(proxied_store.address) as stub:
        for name in NAMES:
            await push(stub, name, files[name])
    return Tiers(
        proxied_store, fault_proxy, files, dirs, vllm_engine, tiny_model_dir, tmp_path / "cache"
    )


async def listed(inference: RunningInference) -> dict[str, Any]:
    response = await inference.stub.ListAdapters(pb.ListAdaptersRequest(), timeout=10)
    return {f"{s.name}@{s.revision}": s for s in response.adapters}


async def tier_info(inference: RunningInference) -> pb.AdapterTiers:
    info = await inference.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    tiers: pb.AdapterTiers = info.tiers
    return tiers


def bytes_on_disk(cache: Path) -> int:
    """Everything the cache keeps, manifests and index included; not downloads in
    progress."""
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and ".tmp" not in p.parts)


def downloads(cache: Path) -> list[Path]:
    """The downloads in progress: each is staged in `.tmp/` and renamed into place once
    complete, so one cut short must remove its folder there."""
    return sorted((cache / ".tmp").iterdir())


async def generate_all(inference: RunningInference, names: Sequence[str]) -> list[int]:
    return [(await inference.generate(name, 4))[0] for name in names]


async def test_replica_serves_once_its_prefetch_set_is_loaded_and_only_routes_the_rest(
    tiers: Tiers,
) -> None:
    async with tiers.replica("--prefetch-adapters", "1") as inference:
        statuses = await listed(inference)

        assert inference.add_calls == ["a@1"]
        assert statuses["a@1"].state == pb.ADAPTER_STATE_READY
        for name in ("b", "c", "d"):
            assert (statuses[f"{name}@1"].state, statuses[f"{name}@1"].tier) == (
                pb.ADAPTER_STATE_AVAILABLE,
                pb.ADAPTER_TIER_STORE,
            )
            assert tiers.weight_gets(name) == 0
        info = await tier_info(inference)
        assert (info.routed_adapters, info.engine_adapters, info.downloads) == (4, 1, 1)


async def test_start_up_with_a_hundred_more_adapters_loads_no_more_of_them(
    tiers: Tiers,
) -> None:
    many = [f"many-{i:03d}" for i in range(100)]
    async with store_stub(tiers.store.address) as stub:
        for batch in range(0, len(many), 10):
            await asyncio.gather(
                *(push(stub, name, tiers.files["d"]) for name in many[batch : batch + 10])
            )

    async with tiers.replica("--prefetch-adapters", "2") as inference:
        info = await tier_info(inference)

        assert sorted(inference.add_calls) == ["a@1", "b@1"]
        assert (info.routed_adapters, info.engine_adapters, info.downloads) == (104, 2, 2)
        assert tiers.weight_gets("d") == 0
        assert (await inference.generate("many-042", 4))[0] == 1


async def test_first_request_to_an_adapter_not_loaded_loads_it_and_matches_the_oracle(
    tiers: Tiers,
) -> None:
    async with tiers.replica("--prefetch-adapters", "0") as inference:
        revision, tokens = await inference.generate("c", 8)

        assert revision == 1
        assert tokens == tuple(greedy_tokens(tiers.model_dir, tiers.dirs["c"], PROMPT, 8))
        info = await tier_info(inference)
        assert (info.engine_misses, info.disk_misses, info.downloads) == (1, 1, 1)
        assert (await listed(inference))["c@1"].state == pb.ADAPTER_STATE_READY


async def test_sixteen_concurrent_first_requests_download_the_adapter_once(
    tiers: Tiers,
) -> None:
    async with tiers.replica("--prefetch-adapters", "0") as inference:
        stalled = tiers.stall("b")
        requests = [asyncio.ensure_future(inference.generate("b", 4)) for _ in range(16)]
        async with asyncio.timeout(GUARD_S):
            await stalled.hit.wait()
        await eventually(
            lambda: _misses_at_least(inference, 16), "all 16 requests wait for the load"
        )
        tiers.proxy.release()

        results = await asyncio.gather(*requests)

        assert {revision for revision, _ in results} == {1}
        assert len({tokens for _, tokens in results}) == 1
        assert tiers.weight_gets("b") == 1
        assert inference.add_calls == ["b@1"]
        assert (await tier_info(inference)).downloads == 1


async def test_request_whose_deadline_passes_during_the_load_gets_deadline_exceeded(
    tiers: Tiers,
) -> None:
    async with tiers.replica("--prefetch-adapters", "0") as inference:
        stalled = tiers.stall("b")
        first = asyncio.ensure_future(inference.generate("b", 4))
        async with asyncio.timeout(GUARD_S):
            await stalled.hit.wait()

        late = inference.generate("b", 4, timeout=0.5)

        assert await code_of(late) == grpc.StatusCode.DEADLINE_EXCEEDED
        tiers.proxy.release()
        assert (await first)[0] == 1
        assert tiers.weight_gets("b") == 1


async def test_load_outlives_the_only_request_that_asked_for_it(tiers: Tiers) -> None:
    async with tiers.replica("--prefetch-adapters", "0") as inference:
        stalled = tiers.stall("b")
        call = inference.stub.Generate(greedy("b", 4), timeout=GUARD_S)
        reading = asyncio.ensure_future(call.read())
        async with asyncio.timeout(GUARD_S):
            await stalled.hit.wait()
        call.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        tiers.proxy.release()

        await eventually(lambda: _state(inference, "b@1", pb.ADAPTER_STATE_READY), "b@1 landed")
        assert (await inference.generate("b", 4))[0] == 1
        assert tiers.weight_gets("b") == 1
        assert inference.add_calls == ["b@1"]


async def test_delete_during_a_load_on_miss_is_not_found_and_leaves_no_files(
    tiers: Tiers,
) -> None:
    async with tiers.replica("--prefetch-adapters", "0") as inference:
        stalled = tiers.stall("b")
        request = asyncio.ensure_future(inference.generate("b", 4))
        async with asyncio.timeout(GUARD_S):
            await stalled.hit.wait()
        before = await _applied_seq(inference)
        await tiers.delete("b")
        await eventually(lambda: _applied_seq_above(inference, before), "the delete applied")
        assert len(downloads(tiers.cache)) == 1
        tiers.proxy.release()

        assert await code_of(request) == grpc.StatusCode.NOT_FOUND
        await eventually(
            lambda: not (tiers.cache / "b").exists() and not downloads(tiers.cache),
            "b's files and its download removed",
        )
        assert inference.add_calls == []


async def test_revision_pushed_during_a_load_on_miss_is_the_one_served(
    tiers: Tiers, tiny_adapter: TinyAdapterFactory
) -> None:
    async with tiers.replica("--prefetch-adapters", "0") as inference:
        stalled = tiers.stall("b")
        request = asyncio.ensure_future(inference.generate("b", 8))
        async with asyncio.timeout(GUARD_S):
            await stalled.hit.wait()
        newer = tiny_adapter(seed=9)
        await tiers.push("b", adapter_files(newer))
        await eventually(lambda: _known(inference, "b@2"), "b@2 taken in")
        tiers.proxy.release()

        revision, tokens = await request

        assert revision == 2
        assert tokens == tuple(greedy_tokens(tiers.model_dir, newer, PROMPT, 8))
        await eventually(
            lambda: not (tiers.cache / "b" / "1").exists() and not downloads(tiers.cache),
            "b@1's files and its download removed",
        )


async def test_disk_stays_under_its_bound_while_every_adapter_keeps_serving(
    tiers: Tiers,
) -> None:
    bound = int(tiers.adapter_bytes * 2.5)
    flags = ("--prefetch-adapters", "0", "--adapter-cache-size", str(bound))
    async with tiers.replica(*flags) as inference:
        for name in [*NAMES, "a", "c", *NAMES]:
            assert (await inference.generate(name, 4))[0] == 1
            assert bytes_on_disk(tiers.cache) <= bound

        info = await tier_info(inference)
        assert info.disk_bytes <= info.disk_capacity_bytes == bound
        assert info.disk_evictions > 0
        assert info.engine_evictions > 0
        assert info.disk_revisions == 2


async def test_first_requests_whose_adapters_together_pass_the_bound_wait_for_room_and_all_succeed(
    tiers: Tiers,
) -> None:
    bound = int(tiers.adapter_bytes * 2.5)
    flags = ("--prefetch-adapters", "0", "--adapter-cache-size", str(bound))
    async with tiers.replica(*flags) as inference:
        stalled = [tiers.stall(name) for name in ("a", "b")]
        requests = [asyncio.ensure_future(inference.generate(name, 4)) for name in [*NAMES, *NAMES]]
        async with asyncio.timeout(GUARD_S):
            for rule in stalled:
                await rule.hit.wait()
        await eventually(lambda: _misses_at_least(inference, 8), "every request waits for a load")
        tiers.proxy.clear()
        tiers.proxy.release()

        results = await asyncio.gather(*requests, return_exceptions=True)

        assert [r if isinstance(r, BaseException) else r[0] for r in results] == [1] * 8
        assert bytes_on_disk(tiers.cache) <= bound


async def test_restart_prefetches_the_adapters_served_most_recently(tiers: Tiers) -> None:
    async with tiers.replica("--prefetch-adapters", "2") as inference:
        await generate_all(inference, ["d", "c"])
    gets = {name: tiers.weight_gets(name) for name in NAMES}

    async with tiers.replica("--prefetch-adapters", "2") as restarted:
        assert sorted(restarted.add_calls) == ["c@1", "d@1"]
        assert {name: tiers.weight_gets(name) for name in NAMES} == gets


async def test_adapter_incompatible_by_its_manifest_is_nacked_without_a_download(
    tiers: Tiers, tiny_adapter: TinyAdapterFactory
) -> None:
    async with tiers.replica("--prefetch-adapters", "0") as inference:
        too_wide = adapter_files(tiny_adapter(rank=32, seed=5))
        await tiers.push("wide", too_wide)
        await eventually(
            lambda: _state(inference, "wide@1", pb.ADAPTER_STATE_FAILED), "wide@1 refused"
        )
        key = blob_key(hashlib.sha256(too_wide[WEIGHTS]).hexdigest())

        assert tiers.proxy.requests.count(("GET", key)) == 0
        assert await code_of(inference.generate("wide", 4)) == grpc.StatusCode.NOT_FOUND


async def _state(inference: RunningInference, key: str, state: int) -> bool:
    status = (await listed(inference)).get(key)
    return status is not None and status.state == state


async def _known(inference: RunningInference, key: str) -> bool:
    return key in await listed(inference)


async def _applied_seq(inference: RunningInference) -> int:
    response = await inference.stub.ListAdapters(pb.ListAdaptersRequest(), timeout=10)
    return int(response.store_seq)


async def _applied_seq_above(inference: RunningInference, seq: int) -> bool:
    return await _applied_seq(inference) > seq


async def _misses_at_least(inference: RunningInference, count: int) -> bool:
    return (await tier_info(inference)).engine_misses >= count
