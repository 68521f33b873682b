"""The assembled inference server: start-up states, store sync, metrics and graceful stop,
with a real store server and the session's vLLM engine."""

from __future__ import annotations

import asyncio
import tomllib
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.common.release import RELEASE
from loraserve.inference.app import InferenceApp
from loraserve.inference.engine import VllmEngine
from loraserve.inference.settings import EngineOptions, parse_settings
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.engine.holding import HoldingEngine
from loraserve.testing.processes.services import inference_args
from loraserve.testing.store.server import RunningStore
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually

pytestmark = pytest.mark.engine

# Guards against a hang only; nothing here measures time.
_READY_TIMEOUT_S = 120


class GatedStarter:
    """Starts the engine only when told, recording the options it was asked for; the
    engine it starts is the session's, able to hold a stream in flight."""

    def __init__(self, llm: Any) -> None:
        self.engine = HoldingEngine(llm, [])
        self.release = asyncio.Event()
        self.options: list[EngineOptions] = []

    async def __call__(self, options: EngineOptions) -> VllmEngine:
        self.options.append(options)
        await self.release.wait()
        return self.engine


@pytest.fixture
async def app_parts(
    store_server: RunningStore, tiny_model_dir: Path, tmp_path: Path, vllm_engine: Any
) -> AsyncIterator[tuple[InferenceApp, GatedStarter, grpc.aio.Channel]]:
    flags = ["--max-lora-rank", "auto", "--metrics-port", "0", "--shutdown-grace", "30"]
    settings = parse_settings(
        inference_args(tiny_model_dir, store_server.address, tmp_path / "cache", *flags),
        {},
        "replica-a",
    )
    starter = GatedStarter(vllm_engine)
    app = InferenceApp(settings, start_engine=starter)
    await app.start()
    starting = asyncio.create_task(app.run_engine_and_sync())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            yield app, starter, channel
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await app.stop()


async def _health(channel: grpc.aio.Channel) -> int:
    response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    return int(response.status)


def _base_request(max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        text="The quick brown fox",
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


async def test_server_is_not_serving_and_unavailable_while_the_engine_starts(
    app_parts: tuple[InferenceApp, GatedStarter, grpc.aio.Channel],
) -> None:
    _, _, channel = app_parts
    stub = pb_grpc.InferenceServiceStub(channel)

    assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        async for _ in stub.Generate(_base_request(2)):
            pass
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_server_serves_after_engine_start_and_first_sync(
    app_parts: tuple[InferenceApp, GatedStarter, grpc.aio.Channel],
) -> None:
    app, starter, channel = app_parts
    stub = pb_grpc.InferenceServiceStub(channel)

    starter.release.set()
    await asyncio.wait_for(app.ready.wait(), _READY_TIMEOUT_S)
    responses = [r async for r in stub.Generate(_base_request(3))]
    info = await stub.GetServerInfo(pb.GetServerInfoRequest())

    assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
    assert responses[-1].usage.completion_tokens == 3
    assert info.replica_id == "replica-a"


async def test_server_info_names_the_loraserve_release_the_replica_runs(
    app_parts: tuple[InferenceApp, GatedStarter, grpc.aio.Channel],
) -> None:
    app, starter, channel = app_parts
    starter.release.set()
    await asyncio.wait_for(app.ready.wait(), _READY_TIMEOUT_S)
    info = await pb_grpc.InferenceServiceStub(channel).GetServerInfo(pb.GetServerInfoRequest())
    assert (info.loraserve_version, RELEASE) == (RELEASE, _version_in_pyproject())


def _version_in_pyproject() -> str:
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    return str(tomllib.loads(pyproject.read_text())["project"]["version"])


async def test_auto_rank_with_an_empty_store_is_vllms_default(
    app_parts: tuple[InferenceApp, GatedStarter, grpc.aio.Channel],
) -> None:
    app, starter, _ = app_parts
    starter.release.set()
    await asyncio.wait_for(app.ready.wait(), _READY_TIMEOUT_S)

    assert [options.max_lora_rank for options in starter.options] == [16]


async def test_metrics_endpoint_exposes_request_counts(
    app_parts: tuple[InferenceApp, GatedStarter, grpc.aio.Channel],
) -> None:
    app, starter, channel = app_parts
    starter.release.set()
    await asyncio.wait_for(app.ready.wait(), _READY_TIMEOUT_S)
    async for _ in pb_grpc.InferenceServiceStub(channel).Generate(_base_request(2)):
        pass

    url = f"http://127.0.0.1:{app.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url).read().decode())

    assert 'loraserve_inference_requests_total{adapter="_base",code="OK"} 1.0' in body
    assert "loraserve_inference_lora_slots" in body


async def test_graceful_stop_lets_a_running_stream_finish(
    app_parts: tuple[InferenceApp, GatedStarter, grpc.aio.Channel],
) -> None:
    app, starter, channel = app_parts
    starter.release.set()
    await asyncio.wait_for(app.ready.wait(), _READY_TIMEOUT_S)
    engine = starter.engine
    engine.hold("")
    call = pb_grpc.InferenceServiceStub(channel).Generate(_base_request(200))
    reading = asyncio.create_task(messages(call))
    await engine.until_held(1, reading)

    stopping = asyncio.create_task(app.stop())
    try:
        await eventually(lambda: _refuses_connections(app.port), "the server stopped listening")
    finally:
        # The whole generation runs once the server is stopping.
        engine.let_go()
    received = await reading
    await stopping

    assert received[-1].finish_reason == pb.FINISH_REASON_LENGTH
    assert received[-1].usage.completion_tokens == 200
    assert sum(len(m.token_ids) for m in received) == 200


async def _refuses_connections(port: int) -> bool:
    """Whether a new connection is refused: the server's shutdown has begun."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as fresh:
        try:
            await health_pb2_grpc.HealthStub(fresh).Check(health_pb2.HealthCheckRequest())
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.UNAVAILABLE
    return False
