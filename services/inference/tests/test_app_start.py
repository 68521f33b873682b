"""Start-up before the store is reachable: with `--max-lora-rank auto` the server keeps
waiting (NOT_SERVING, and calls say what it waits for) instead of exiting. No engine
is started here: sizing it is exactly what waits."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.inference.app import InferenceApp
from loraserve.inference.engine import VllmEngine
from loraserve.inference.settings import EngineOptions, parse_settings
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.processes.services import free_port, inference_args
from loraserve.testing.waiting import eventually

WAITING = "engine.auto_rank_waiting"


async def test_auto_rank_keeps_waiting_for_an_unreachable_store_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="loraserve.inference.app")
    store = f"127.0.0.1:{free_port()}"  # nothing listens there
    settings = parse_settings(
        inference_args(tmp_path / "model", store, tmp_path / "cache", "--max-lora-rank", "auto"),
        {},
        "replica-a",
    )
    started: list[EngineOptions] = []

    async def start_engine(options: EngineOptions) -> VllmEngine:
        started.append(options)
        raise AssertionError("the engine must not start before its rank is known")

    app = InferenceApp(settings, start_engine=start_engine)
    await app.start()
    starting = asyncio.create_task(app.run_engine_and_sync())
    try:
        await eventually(lambda: caplog.text.count(WAITING) >= 3, f"3 x {WAITING}")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest()
            )
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await pb_grpc.InferenceServiceStub(channel).GetServerInfo(pb.GetServerInfoRequest())
        assert not starting.done()
        assert started == []
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"waiting for the adapter store at {store}" in str(raised.value.details())
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await app.stop()
