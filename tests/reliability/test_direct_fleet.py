"""Issue 24, a rolling upgrade: a replica that streams its adapters through the store
(`--adapter-download stream`, as replicas before direct reads) and one that reads them
from S3 with presigned URLs serve the same revision, from the same store.

Real parts: the store over gRPC on moto's S3 over HTTP, whole InferenceApps (gRPC,
sync, registry, cache) on the session's vLLM engine, one after the other. The store
signs URLs for a fault proxy's endpoint, so the proxy sees exactly the direct reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from prometheus_client import generate_latest

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import adapter_files, inference_app
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import S3FaultProxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore, running_store

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

WEIGHTS = "adapter_model.safetensors"


async def _serve_once(
    llm: AsyncLLM, model_dir: Path, store: RunningStore, cache_dir: Path, extra: Sequence[str]
) -> tuple[tuple[int, tuple[int, ...]], str]:
    """One replica's greedy generation with `alpha`, and its metrics exposition."""
    async with inference_app(
        llm,
        model_dir=model_dir,
        store_address=store.address,
        cache_dir=cache_dir,
        replica_id=cache_dir.name,
        extra=extra,
    ) as running:
        generated = await running.generate("alpha", 8)
        exposition = generate_latest(running.app.metrics.registry).decode()
    return generated, exposition


async def test_a_streaming_replica_and_a_direct_replica_serve_the_same_revision(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    fault_proxy: S3FaultProxy,
    tmp_path: Path,
) -> None:
    files = adapter_files(tiny_adapter(seed=5))
    weights_key = blob_key(hashlib.sha256(files[WEIGHTS]).hexdigest())
    async with running_store(s3_bucket, download_url_endpoint=fault_proxy.endpoint_url) as store:
        async with store_stub(store.address) as stub:
            await push(stub, "alpha", files)
        old, old_metrics = await _serve_once(
            vllm_engine, tiny_model_dir, store, tmp_path / "old", ["--adapter-download", "stream"]
        )
        gets_by_the_old_replica = fault_proxy.requests.count(("GET", weights_key))
        new, new_metrics = await _serve_once(
            vllm_engine, tiny_model_dir, store, tmp_path / "new", []
        )
    assert old == new
    assert (old[0], len(old[1])) == (1, 8)
    assert gets_by_the_old_replica == 0
    assert fault_proxy.requests.count(("GET", weights_key)) == 1
    assert 'loraserve_inference_adapter_downloads_total{path="stream"} 1.0' in old_metrics
    assert 'loraserve_inference_adapter_downloads_total{path="direct"} 1.0' in new_metrics
