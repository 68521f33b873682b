"""The inference server serves exactly what the store says, and keeps on disk only
what it serves or is loading.

- A pinned `NAME@REV` load that a delete overtakes is discarded: the request gets
  NOT_FOUND and the revision never becomes servable.
- A relist (after OUT_OF_RANGE) routes exactly what the listing says: an adapter
  deleted and pushed again unpromoted has no current revision, so `NAME` is not found.
- A NACKed revision leaves no files; an adapter the manifest already shows to be
  incompatible is NACKed without a byte downloaded; an earlier run's leftovers are
  swept at start-up while its routable revisions are reused.

Real parts: the store's gRPC server over S3 on HTTP through the S3 fault proxy (or a
store process with short log retention behind a TCP proxy), and the whole inference
app on the session's vLLM engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import pytest
from safetensors.numpy import load, save

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.inference.v1 import inference_pb2 as inference_pb
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import RunningInference, adapter_files, inference_app
from loraserve.testing.inference.stack import Stack
from loraserve.testing.processes.services import free_port, store_process
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.calls import rpc_code as code_of
from loraserve.testing.waiting import GUARD_S, eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

REPLICA = "consistency-replica"
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def weights_key(files: AdapterFiles) -> str:
    return blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())


async def test_pinned_load_overtaken_by_a_delete_is_discarded_and_the_request_is_not_found(
    serving_stack: Stack, tiny_adapter: TinyAdapterFactory
) -> None:
    first = adapter_files(tiny_adapter(seed=1))
    await serving_stack.push("alpha", adapter_files(tiny_adapter(seed=2)))
    await eventually(lambda: serving_stack.inference.routes("alpha", 2), "alpha@2 routed")
    await eventually(
        lambda: _absent(serving_stack.inference, "alpha", 1),
        "alpha@1 removed after the route flipped",
    )
    stalled = serving_stack.proxy.add(Fault.STALL, "GET", weights_key(first))

    request = asyncio.ensure_future(serving_stack.inference.generate("alpha@1", 4))
    async with asyncio.timeout(GUARD_S):
        await stalled.hit.wait()
    await serving_stack.delete("alpha")
    await eventually(lambda: serving_stack.inference.routes("alpha", 0), "the delete applied")
    serving_stack.proxy.release()

    assert await code_of(request) == grpc.StatusCode.NOT_FOUND
    assert (
        await code_of(serving_stack.inference.generate("alpha@1", 4)) == grpc.StatusCode.NOT_FOUND
    )
    await eventually(
        lambda: _absent(serving_stack.inference, "alpha", 2), "alpha@2 drained after the delete"
    )
    assert await serving_stack.inference.statuses("alpha") == {}
    assert serving_stack.inference.add_calls.count("alpha@1") == 1
    assert not (serving_stack.cache / "alpha" / "1").exists()


async def test_revision_nacked_after_its_download_leaves_no_files(
    serving_stack: Stack, tiny_adapter: TinyAdapterFactory
) -> None:
    # Only the tensors show it: lora_A of one layer narrower than the layer.
    await serving_stack.push("alpha", _narrowed(adapter_files(tiny_adapter(seed=2))))

    report = await serving_stack.report("alpha", 2)

    assert report.type == store_pb.REPORT_TYPE_NACK
    assert "lora_A" in report.last_error.message
    assert not (serving_stack.cache / "alpha" / "2").exists()
    assert list((serving_stack.cache / ".tmp").iterdir()) == []
    assert await serving_stack.inference.current("alpha") == 1


INCOMPATIBLE_BY_MANIFEST: dict[str, tuple[Callable[[TinyAdapterFactory], AdapterFiles], str]] = {
    "another-base-model": (
        lambda build: _with_config(
            adapter_files(build(seed=2)), base_model_name_or_path="meta-llama/Llama-3.1-8B"
        ),
        "Llama-3.1-8B",
    ),
    "rank-above-max-lora-rank": (lambda build: adapter_files(build(rank=32, seed=5)), "rank 32"),
}


@pytest.mark.parametrize("case", INCOMPATIBLE_BY_MANIFEST, ids=list(INCOMPATIBLE_BY_MANIFEST))
async def test_adapter_incompatible_by_its_manifest_is_nacked_without_downloading_it(
    case: str, serving_stack: Stack, tiny_adapter: TinyAdapterFactory
) -> None:
    build, reason = INCOMPATIBLE_BY_MANIFEST[case]
    files = build(tiny_adapter)
    await serving_stack.push("alpha", files)

    report = await serving_stack.report("alpha", 2)

    assert report.type == store_pb.REPORT_TYPE_NACK
    assert report.last_error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert reason in report.last_error.message
    assert serving_stack.blob_gets(weights_key(files)) == 0
    assert not (serving_stack.cache / "alpha" / "2").exists()
    listed = (await serving_stack.inference.statuses("alpha"))[2]
    assert (listed.state, reason in listed.last_error) == (inference_pb.ADAPTER_STATE_FAILED, True)


async def test_cache_left_by_an_earlier_run_is_swept_at_start_and_routable_revisions_reused(
    serving_stack: Stack,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
) -> None:
    # `serving_stack` serves alpha@1; an earlier run with its own cache also served beta@1.
    earlier = serving_stack.cache.parent / "earlier-cache"
    await serving_stack.push("beta", adapter_files(tiny_adapter(seed=3)))
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=serving_stack.store.address,
        cache_dir=earlier,
        replica_id="earlier-replica",
    ):
        pass
    assert _revision_dirs(earlier) == ["alpha/1", "beta/1"]
    await serving_stack.delete("beta")
    (earlier / "gamma" / "7").mkdir(parents=True)
    (earlier / "gamma" / "7" / WEIGHTS).write_bytes(b"left over")
    (earlier / ".tmp" / "alpha-1-half-done").mkdir(parents=True)
    alpha_gets = serving_stack.blob_gets(weights_key(adapter_files(tiny_adapter(seed=1))))

    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=serving_stack.store.address,
        cache_dir=earlier,
        replica_id="later-replica",
    ) as later:
        revision, _ = await later.generate("alpha", 4)
        assert revision == 1
        assert _revision_dirs(earlier) == ["alpha/1"]
        # The earlier run's index of use stays: it orders this run's prefetch.
        assert sorted(p.name for p in earlier.iterdir()) == [".index.json", ".tmp", "alpha"]
        assert list((earlier / ".tmp").iterdir()) == []
    assert serving_stack.blob_gets(weights_key(adapter_files(tiny_adapter(seed=1)))) == alpha_gets


async def test_relist_routes_nothing_for_an_adapter_deleted_and_pushed_again_unpromoted(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every commit snapshots and prunes all but the newest entry, and a restarted store
    # keeps no events in memory: a replica that missed two commits cannot resume its
    # watch (OUT_OF_RANGE) and lists again.
    retention = ["--snapshot-every", "1", "--log-retention", "1"]
    port = free_port()
    async with (
        store_process(s3_bucket, tmp_path / "store.log", port=port, extra=retention) as store,
        tcp_proxy(port) as proxy,
    ):
        async with store_stub(store.address) as stub:
            await push(stub, "alpha", adapter_files(tiny_adapter(seed=1)))
        async with inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=proxy.address,
            cache_dir=tmp_path / "cache",
            replica_id=REPLICA,
            # alpha@2 is pinned below while no revision is current.
            extra=("--pin-policy", "any"),
        ) as inference:
            await eventually(lambda: inference.routes("alpha", 1), "alpha@1 routed")
            proxy.cut()
            async with store_stub(store.address) as stub:
                await stub.DeleteAdapter(store_pb.DeleteAdapterRequest(name="alpha"))
                await push(stub, "alpha", adapter_files(tiny_adapter(seed=2)), no_promote=True)
                await push(stub, "beta", adapter_files(tiny_adapter(seed=3)))
            store.kill()
            await store.wait()
            async with store_process(
                s3_bucket, tmp_path / "store-restarted.log", port=port, extra=retention
            ):
                proxy.restore()
                await eventually(lambda: inference.routes("beta", 1), "the relist applied")
                await eventually(lambda: inference.routes("alpha", 0), "alpha unrouted")

                not_found = grpc.StatusCode.NOT_FOUND
                assert await code_of(inference.generate("alpha", 4)) == not_found
                assert await code_of(inference.generate("alpha@1", 4)) == not_found
                revision, tokens = await inference.generate("alpha@2", 4)
                assert (revision, len(tokens)) == (2, 4)
                assert await inference.current("alpha") == 0
    assert "sync.watch_behind" in caplog.text


async def _absent(inference: RunningInference, name: str, revision: int) -> bool:
    return revision not in await inference.statuses(name)


def _revision_dirs(cache: Path) -> list[str]:
    return sorted(
        f"{adapter.name}/{rev.name}"
        for adapter in cache.iterdir()
        if not adapter.name.startswith(".")
        for rev in adapter.iterdir()
    )


def _with_config(files: AdapterFiles, **fields: Any) -> AdapterFiles:
    return files | {CONFIG: json.dumps(json.loads(files[CONFIG]) | fields).encode()}


def _narrowed(files: AdapterFiles) -> AdapterFiles:
    """Layer 0's q_proj lora_A cut to 64 input columns, rank kept."""
    tensors = load(files[WEIGHTS])
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[name] = np.resize(tensors[name], (tensors[name].shape[0], 64)).astype(
        tensors[name].dtype
    )
    return files | {WEIGHTS: save(tensors)}
