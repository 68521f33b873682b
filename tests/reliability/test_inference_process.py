"""Row 11, inference side: SIGTERM on `inference serve`, a real process with its own
vLLM engine, while streams run.

SIGTERM turns health NOT_SERVING (seen on a health Watch opened before), streams
already running finish within the grace period, and the process exits cleanly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import adapter_files, greedy
from loraserve.testing.plugins.figures import add_figure
from loraserve.testing.processes.services import InferenceProcess, inference_process
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import GUARD_S

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
async def server(
    module_store_server: RunningStore,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[InferenceProcess]:
    """`inference serve` synced to a store holding `alpha` revision 1."""
    async with store_stub(module_store_server.address) as stub:
        await push(stub, "alpha", adapter_files(tiny_adapter(seed=1)))
    directory = tmp_path_factory.mktemp("inference-process")
    async with inference_process(
        tiny_model_dir,
        module_store_server.address,
        directory / "cache",
        directory / "inference.log",
        extra=["--shutdown-grace", "60", "--replica-id", "process-replica"],
    ) as running:
        yield running


async def test_sigterm_turns_health_not_serving_and_running_streams_finish(
    server: InferenceProcess, pytestconfig: pytest.Config
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        first_health = (await anext(aiter(health))).status
        stub = pb_grpc.InferenceServiceStub(channel)
        streams = [stub.Generate(greedy("alpha", 300), timeout=GUARD_S) for _ in range(3)]
        # Under load the engine may hand over a whole stream at once (vLLM merges what
        # a lagging reader has not taken), so a first message can also be the last.
        firsts = [await anext(aiter(stream)) for stream in streams]
        server.terminate()
        add_figure(pytestconfig, "faults.sigterm_inference")
        async with asyncio.timeout(GUARD_S):
            second_health = (await anext(aiter(health))).status
        finished = [
            [first, *[m async for m in stream]]
            for first, stream in zip(firsts, streams, strict=True)
        ]
    exit_code = await server.wait()
    assert (first_health, second_health) == (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert [whole[-1].finish_reason for whole in finished] == [pb.FINISH_REASON_LENGTH] * 3
    assert [whole[-1].usage.completion_tokens for whole in finished] == [300] * 3
    assert [sum(len(m.token_ids) for m in whole) for whole in finished] == [300] * 3
    assert exit_code == 0
