"""Rows 4 and 5: the watch stream reset while revisions are pushed, and the store and
the inference server both restarted in the middle of a hot-swap.

The store runs as a real process whose state lives only in S3; the inference server
is the whole InferenceApp on the session's engine, restarted with the same cache
directory. `add_calls` (every adapter handed to the engine) shows what was applied.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import PROMPT, adapter_files, inference_app
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.processes.services import free_port, store_process
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import PROCESS_GUARD_S, eventually
from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.slow]

REPLICA = "restart-replica"
WEIGHTS = "adapter_model.safetensors"


async def _reports(address: str, name: str) -> list[Any]:
    async with store_stub(address) as stub:
        response = await stub.GetAdapterStatus(store_pb.GetAdapterStatusRequest(name=name))
    return list(response.statuses)


async def _acked(address: str, name: str, revision: int) -> None:
    async with asyncio.timeout(PROCESS_GUARD_S):
        while True:
            for status in await _reports(address, name):
                if (status.reported_revision, status.type) == (
                    revision,
                    store_pb.REPORT_TYPE_ACK,
                ):
                    return
            await asyncio.sleep(0.05)


async def test_watch_reset_while_three_revisions_are_pushed_serves_the_latest_each_applied_once(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
    pytestconfig: pytest.Config,
) -> None:
    async with (
        store_stub(store_server.address) as store,
        tcp_proxy(store_server.port) as proxy,
        inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=proxy.address,
            cache_dir=tmp_path / "cache",
            replica_id=REPLICA,
        ) as inference,
    ):
        await push(store, "flaky", adapter_files(tiny_adapter(seed=1)))
        await eventually(lambda: inference.routes("flaky", 1), "flaky@1 routed", PROCESS_GUARD_S)
        proxy.cut()
        add_figure(pytestconfig, "faults.watch_resets")
        latest = tiny_adapter(seed=4)
        for seed in (2, 3, 4):
            await push(
                store, "flaky", adapter_files(tiny_adapter(seed=seed) if seed < 4 else latest)
            )
        proxy.restore()
        await eventually(lambda: inference.routes("flaky", 4), "flaky@4 routed", PROCESS_GUARD_S)
        revision, tokens = await inference.generate("flaky", 8)
        applied = [call for call in inference.add_calls if call.startswith("flaky@")]
    expected = await asyncio.to_thread(greedy_tokens, tiny_model_dir, latest, PROMPT, 8)
    assert proxy.connections >= 2
    assert len(applied) == len(set(applied)), applied
    assert (applied[0], applied[-1]) == ("flaky@1", "flaky@4")
    assert (revision, list(tokens)) == (4, expected)


async def test_store_and_inference_restarted_mid_swap_converge_serving_only_acked_revisions(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    fault_proxy: S3FaultProxy,
    tmp_path: Path,
    pytestconfig: pytest.Config,
) -> None:
    port = free_port()
    cache = tmp_path / "cache"
    first, second = tiny_adapter(seed=1), tiny_adapter(seed=2)
    second_files = adapter_files(second)
    stalled = fault_proxy.add(
        Fault.STALL, "GET", blob_key(hashlib.sha256(second_files[WEIGHTS]).hexdigest())
    )
    served_before: list[int] = []
    async with store_process(
        s3_bucket, tmp_path / "store-1.log", port=port, endpoint_url=fault_proxy.endpoint_url
    ) as store:
        async with inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=store.address,
            cache_dir=cache,
            replica_id=REPLICA,
        ) as inference:
            async with store_stub(store.address) as stub:
                await push(stub, "swap", adapter_files(first))
                await _acked(store.address, "swap", 1)
                await push(stub, "swap", second_files)
            async with asyncio.timeout(PROCESS_GUARD_S):
                await stalled.hit.wait()
            served_before.append((await inference.generate("swap", 4))[0])
            reports_mid_swap = await _reports(store.address, "swap")
            store.kill()
            await store.wait()
            add_figure(pytestconfig, "faults.sigkill_store")
        add_figure(pytestconfig, "faults.inference_restarts")
    fault_proxy.drop()
    fault_proxy.clear()
    async with (
        store_process(
            s3_bucket, tmp_path / "store-2.log", port=port, endpoint_url=fault_proxy.endpoint_url
        ) as store,
        inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=store.address,
            cache_dir=cache,
            replica_id=REPLICA,
        ) as inference,
    ):
        await _acked(store.address, "swap", 2)
        revision, tokens = await inference.generate("swap", 8)
        reports_after = await _reports(store.address, "swap")
    expected = await asyncio.to_thread(greedy_tokens, tiny_model_dir, second, PROMPT, 8)
    assert served_before == [1]
    assert [(r.reported_revision, r.serving_revision) for r in reports_mid_swap] == [(1, 1)]
    assert (revision, list(tokens)) == (2, expected)
    assert [(r.reported_revision, r.type) for r in reports_after] == [(2, store_pb.REPORT_TYPE_ACK)]
    assert list((cache / ".tmp").glob("*")) == []
