"""The inference extension's model-server protocol gauges, as an endpoint picker reads them:
scraped from a real inference server's metrics endpoint while a request streams, and
parsed with prometheus_client's own text parser."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from loraserve.inference.engine import EngineStats
from loraserve.inference.engine.stats import SchedulerTap
from loraserve.inference.metrics.model_server import RESIDENT, ModelServerProtocolCollector
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.session import MAX_LORAS
from loraserve.testing.inference.app import RunningInference, adapter_files, greedy, inference_app
from loraserve.testing.store.server import RunningStore
from loraserve.testing.streams import running_stream
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

GAUGES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:lora_requests_info",
)


def _samples(text: str) -> dict[str, list[Sample]]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def _scrape(port: int) -> dict[str, list[Sample]]:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return _samples(response.read().decode())


def _lora_info(samples: dict[str, list[Sample]]) -> Sample:
    (sample,) = samples["vllm:lora_requests_info"]
    return sample


# -- the rendering, from engine stats ---------------------------------------------------


def _render(stats: EngineStats, max_lora: int = 4) -> dict[str, list[Sample]]:
    from prometheus_client import generate_latest

    registry = CollectorRegistry()
    registry.register(ModelServerProtocolCollector(lambda: stats, max_lora=max_lora))
    return _samples(generate_latest(registry).decode())


def test_adapters_are_listed_by_served_name_running_and_waiting_apart() -> None:
    stats = EngineStats(
        running=2,
        waiting=1,
        kv_cache_usage=0.25,
        running_adapters=frozenset({"alpha@3", "beta@1"}),
        waiting_adapters=frozenset({"gamma@2"}),
    )

    sample = _lora_info(_render(stats, max_lora=4))

    assert sample.labels == {
        "max_lora": "4",
        "running_lora_adapters": "alpha,beta",
        "waiting_lora_adapters": "gamma",
    }


def test_an_adapter_running_is_not_also_listed_as_waiting() -> None:
    # The scorer counts both lists as slots taken; a running adapter takes one.
    stats = EngineStats(
        running=1,
        waiting=2,
        kv_cache_usage=0.25,
        running_adapters=frozenset({"alpha@3"}),
        waiting_adapters=frozenset({"alpha@3", "gamma@2"}),
    )

    sample = _lora_info(_render(stats))

    assert sample.labels["running_lora_adapters"] == "alpha"
    assert sample.labels["waiting_lora_adapters"] == "gamma"


def test_queue_gauges_render_the_engine_stats() -> None:
    samples = _render(EngineStats(running=3, waiting=2, kv_cache_usage=0.5))

    assert samples["vllm:num_requests_running"][0].value == 3
    assert samples["vllm:num_requests_waiting"][0].value == 2
    assert samples["vllm:kv_cache_usage_perc"][0].value == 0.5


def test_scheduler_tap_keeps_adapters_with_requests_of_each_kind_apart() -> None:
    # vLLM fills both dicts with every adapter that has any request, zero where none.
    tap = SchedulerTap()
    stats = SimpleNamespace(
        num_running_reqs=1,
        num_waiting_reqs=1,
        num_skipped_waiting_reqs=0,
        kv_cache_usage=0.1,
        running_lora_adapters={"alpha@1": 1, "beta@1": 0},
        waiting_lora_adapters={"alpha@1": 0, "beta@1": 1},
    )

    tap.record(stats, None)

    assert tap.running_adapters == {"alpha@1"}
    assert tap.waiting_adapters == {"beta@1"}


# -- a real server ----------------------------------------------------------------------


@pytest.fixture
async def served(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[RunningInference]:
    """An inference server with metrics, synced with a store that holds adapter `alpha`."""
    flags = ("--metrics-port", "0", "--openai-listen", "127.0.0.1:0", "--max-loras", str(MAX_LORAS))
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        extra=flags,
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
    ) as running:
        yield running


@pytest.mark.engine
async def test_endpoint_picker_sees_the_adapter_running_while_its_request_streams(
    served: RunningInference,
) -> None:
    port = served.app.metrics_port
    assert port is not None
    call, _ = await running_stream(lambda: served.stub.Generate(greedy("alpha", 400), timeout=120))
    seen: dict[str, list[Sample]] = {}

    async def alpha_running() -> bool:
        seen.update(await asyncio.to_thread(_scrape, port))
        return _lora_info(seen).labels["running_lora_adapters"] == "alpha"

    before = time.time()
    await eventually(alpha_running, "alpha listed as running")
    after = time.time()
    call.cancel()

    assert set(GAUGES) <= set(seen)
    info = _lora_info(seen)
    assert info.labels["max_lora"] == str(MAX_LORAS)
    assert info.labels["waiting_lora_adapters"] == ""
    assert before <= info.value <= after
    assert seen["vllm:num_requests_running"][0].value == 1
    assert seen["vllm:num_requests_waiting"][0].value == 0
    assert 0 < seen["vllm:kv_cache_usage_perc"][0].value <= 1


@pytest.mark.engine
async def test_openai_port_serves_the_same_metrics(
    served: RunningInference,
) -> None:
    # The endpoint picker scrapes the port the InferencePool targets: the OpenAI one.
    port = served.app.openai_port
    assert port is not None

    samples = await asyncio.to_thread(_scrape, port)

    assert set(GAUGES) <= set(samples)
    assert _lora_info(samples).labels["max_lora"] == str(MAX_LORAS)
    assert "loraserve_inference_lora_slots" in samples


@pytest.mark.engine
async def test_endpoint_picker_sees_no_adapter_once_requests_end(
    served: RunningInference,
) -> None:
    port = served.app.metrics_port
    assert port is not None
    await served.generate("alpha", 4)

    async def idle() -> bool:
        info = _lora_info(await asyncio.to_thread(_scrape, port))
        return info.labels["running_lora_adapters"] == "" == info.labels["waiting_lora_adapters"]

    await eventually(idle, "no adapter listed once the request ended")


@pytest.mark.engine
async def test_an_adapter_in_the_engine_is_named_by_the_residency_gauge(
    served: RunningInference,
) -> None:
    port = served.app.metrics_port
    assert port is not None
    await served.generate("alpha", 4)
    samples = await asyncio.to_thread(_scrape, port)
    resident = {s.labels["adapter"]: s.value for s in samples[RESIDENT]}
    assert resident == {"alpha": 1.0}


@pytest.mark.engine
async def test_replica_load_reports_the_tokens_a_finished_sequence_generated(
    served: RunningInference,
) -> None:
    _, tokens = await served.generate("alpha", 6)

    reported: dict[str, float] = {}

    async def reported_any() -> bool:
        load = await served.stub.GetReplicaLoad(pb.GetReplicaLoadRequest())
        reported.update(load.adapter_tokens_per_sequence)
        return bool(reported)

    # As of the last whole second: reported from the next one on.
    await eventually(reported_any, "the tokens reported")
    assert reported == pytest.approx({"alpha": len(tokens)})


@pytest.mark.engine
async def test_replica_load_counts_a_running_stream_and_names_the_resident_adapter(
    served: RunningInference,
) -> None:
    call, _ = await running_stream(lambda: served.stub.Generate(greedy("alpha", 400), timeout=120))
    try:
        load = await served.stub.GetReplicaLoad(pb.GetReplicaLoadRequest())
    finally:
        call.cancel()
    assert load.pending_sequences == 1
    assert list(load.resident_adapters) == ["alpha"]
    assert load.max_pending_sequences > 0
    assert dict(load.adapter_pending_sequences) == {"alpha": 1}
    # Reported while pending, its rate as of the last whole second (0 within it).
    assert "alpha" in load.adapter_admission_rates
    as_of = load.admission_rates_as_of
    assert (as_of.nanos, 0 < time.time() - as_of.seconds < 60) == (0, True)
