"""Row 10: a bounded soak. Many concurrent streams over many adapters while new
revisions are pushed every few seconds, through the whole inference server on the
real engine and a real store.

Every stream completes or is refused at admission (RESOURCE_EXHAUSTED beyond its
bound instead of queueing without limit; no other status), the
engine never holds more than the admission bound, memory stays flat, and at the
end the server serves exactly what the store says is current.

The bound is short in CI; set LORASERVE_SOAK_SECONDS for a longer run.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import psutil
import pytest
from safetensors.numpy import load, save

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import RunningInference, adapter_files, greedy, inference_app
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import PROCESS_GUARD_S

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.slow]

SOAK_S = float(os.environ.get("LORASERVE_SOAK_SECONDS", "30"))
# More clients than the admission bound, which itself admits over 100 streams at once.
CLIENTS = 160
ADAPTERS = 16
MAX_PENDING = 128
PUSH_EVERY_S = 3.0
# The one status a stream may end with besides OK: refused at admission, beyond its
# bound. Nothing else here may fail a stream: the engine keeps running, the store stays
# up, and a push swaps revisions without cutting the streams on the old one, so an
# UNAVAILABLE would be a stream lost to a swap, not a clean end.
CLEAN = {grpc.StatusCode.RESOURCE_EXHAUSTED}
# Growth of the server process's resident memory allowed from the warm-up to the end:
# what its allocator and gRPC buffers still settle into. A leak of what each stream
# carries (its request, its chunks: a few KiB) over the thousands of streams served
# after the warm-up grows past it.
RSS_GROWTH_BYTES = 16 << 20
WEIGHTS = "adapter_model.safetensors"


def _variant(files: AdapterFiles, seed: int) -> AdapterFiles:
    """Another valid adapter with the same shapes and different weights."""
    rng = np.random.default_rng(seed)
    tensors = load(files[WEIGHTS])
    changed = {
        name: (t * rng.uniform(0.5, 1.5, t.shape)).astype(t.dtype) for name, t in tensors.items()
    }
    return files | {WEIGHTS: save(changed)}


def _server_rss() -> int:
    """Resident memory of the process under test: this one, where `inference_app` runs
    the inference server (and the store and the clients, which keep nothing per
    stream). Not the engine core's process, whose memory is mostly the KV cache vLLM
    allocates at its start, so that its gigabytes do not drown a leak in their noise."""
    return int(psutil.Process().memory_info().rss)


class Soak:
    def __init__(self, inference: RunningInference, store: Any, base: AdapterFiles) -> None:
        self.inference = inference
        self.store = store
        self.base = base
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.tokens = 0
        self.pushes = 0
        self.peak_in_engine = 0
        self.rss: list[int] = []
        self.deadline = 0.0

    async def client(self, index: int) -> None:
        rng = random.Random(index)
        while time.monotonic() < self.deadline:
            name = f"soak-{rng.randrange(ADAPTERS):02d}"
            request = greedy(name, rng.randint(2, 24))
            finished = False
            try:
                async for message in self.inference.stub.Generate(request, timeout=PROCESS_GUARD_S):
                    self.tokens += len(message.token_ids)
                    finished = message.finish_reason != 0
            except grpc.aio.AioRpcError as e:
                self.outcomes[e.code().name] += 1
                await asyncio.sleep(0.2)
                continue
            self.outcomes["OK" if finished else "NO_FINISH_REASON"] += 1

    async def pusher(self) -> None:
        seed = 1000
        while time.monotonic() < self.deadline:
            await asyncio.sleep(PUSH_EVERY_S)
            seed += 1
            await push(self.store, f"soak-{seed % ADAPTERS:02d}", _variant(self.base, seed))
            self.pushes += 1

    async def sampler(self) -> None:
        while time.monotonic() < self.deadline:
            self.peak_in_engine = max(self.peak_in_engine, await self.inference.in_engine())
            self.rss.append(await asyncio.to_thread(_server_rss))
            await asyncio.sleep(0.5)


async def _store_currents(store: Any) -> dict[str, int]:
    listed = await store.ListAdapters(store_pb.ListAdaptersRequest(page_size=1000))
    return {a.name: a.current_revision for a in listed.adapters}


async def _served_currents(inference: RunningInference) -> dict[str, int]:
    from loraserve.inference.v1 import inference_pb2 as pb

    listed = await inference.stub.ListAdapters(pb.ListAdaptersRequest())
    return {s.name: s.revision for s in listed.adapters if s.current}


async def _converged(inference: RunningInference, store: Any) -> dict[str, int]:
    async with asyncio.timeout(PROCESS_GUARD_S):
        while True:
            wanted = await _store_currents(store)
            if await _served_currents(inference) == wanted:
                return wanted
            await asyncio.sleep(0.1)


async def test_soak_streams_end_cleanly_memory_stays_flat_and_state_matches_the_store(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
    pytestconfig: pytest.Config,
) -> None:
    base = adapter_files(tiny_adapter(seed=7))
    async with store_stub(store_server.address) as store:
        for i in range(ADAPTERS):
            await push(store, f"soak-{i:02d}", _variant(base, i))
        async with inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=store_server.address,
            cache_dir=tmp_path / "cache",
            extra=["--max-pending-requests", str(MAX_PENDING)],
        ) as inference:
            await _converged(inference, store)
            soak = Soak(inference, store, base)
            soak.deadline = time.monotonic() + SOAK_S
            await asyncio.gather(
                soak.pusher(),
                soak.sampler(),
                *(soak.client(i) for i in range(CLIENTS)),
            )
            final = await _converged(inference, store)
            left_in_engine = await inference.in_engine()
    streams = sum(soak.outcomes.values())
    add_figure(pytestconfig, "soak.streams", streams)
    add_figure(pytestconfig, "soak.concurrent_clients", CLIENTS)
    add_figure(pytestconfig, "soak.adapters", ADAPTERS)
    add_figure(pytestconfig, "soak.revisions_pushed", soak.pushes)
    add_figure(pytestconfig, "soak.tokens", soak.tokens)
    add_figure(pytestconfig, "soak.peak_requests_in_engine", soak.peak_in_engine)
    for outcome, count in soak.outcomes.items():
        add_figure(pytestconfig, f"soak.outcome.{outcome}", count)
    warm = statistics.median(soak.rss[: max(1, len(soak.rss) // 3)])
    add_figure(pytestconfig, "soak.rss_warm_mib", int(warm) >> 20)
    add_figure(pytestconfig, "soak.rss_end_mib", soak.rss[-1] >> 20)
    assert set(soak.outcomes) <= {"OK", *(code.name for code in CLEAN)}, soak.outcomes
    assert soak.outcomes["OK"] > 0
    assert 100 <= soak.peak_in_engine <= MAX_PENDING
    assert soak.rss[-1] - warm <= RSS_GROWTH_BYTES, (int(warm) >> 20, soak.rss[-1] >> 20)
    assert len(final) == ADAPTERS
    assert sum(final.values()) == ADAPTERS + soak.pushes
    assert left_in_engine == 0
