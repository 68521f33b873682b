"""Rows 6 and 11 against `inference serve` as a real process with its own vLLM engine:
an adapter whose tensor shapes do not fit the model (which could corrupt or kill the
engine, so it is not tried on the session's shared engine), and SIGTERM during traffic.

SIGTERM turns health NOT_SERVING (seen on a health Watch opened before), streams
already running finish within the grace period, and the process exits cleanly.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from safetensors.numpy import load, save

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.figures import add_figure
from loraserve.testing.inferenceapp import adapter_files, greedy
from loraserve.testing.models import TinyAdapterFactory
from loraserve.testing.processes import InferenceProcess, inference_process
from loraserve.testing.s3 import S3Bucket
from loraserve.testing.store import RunningStore, running_store
from loraserve.testing.storecalls import push, store_stub

pytestmark = [pytest.mark.faults, pytest.mark.engine, pytest.mark.slow]

GUARD_S = 60
WEIGHTS = "adapter_model.safetensors"
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION.value[0]
_buckets = itertools.count(1)


@pytest.fixture(scope="module")
async def module_store(s3_server: str) -> AsyncIterator[RunningStore]:
    bucket = S3Bucket(s3_server, f"inference-process-{next(_buckets)}")
    bucket.client().create_bucket(Bucket=bucket.bucket)
    async with running_store(bucket) as store:
        yield store


@pytest.fixture(scope="module")
async def server(
    module_store: RunningStore,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[InferenceProcess]:
    """`inference serve` synced to a store holding `alpha` revision 1."""
    async with store_stub(module_store.address) as stub:
        await push(stub, "alpha", adapter_files(tiny_adapter(seed=1)))
    directory = tmp_path_factory.mktemp("inference-process")
    async with inference_process(
        tiny_model_dir,
        module_store.address,
        directory / "cache",
        directory / "inference.log",
        extra=["--shutdown-grace", "60", "--replica-id", "process-replica"],
    ) as running:
        yield running


async def _report(store: RunningStore, name: str, revision: int) -> Any:
    async with store_stub(store.address) as stub, asyncio.timeout(GUARD_S):
        while True:
            response = await stub.GetAdapterStatus(store_pb.GetAdapterStatusRequest(name=name))
            for status in response.statuses:
                if status.reported_revision == revision:
                    return status
            await asyncio.sleep(0.05)


async def _generate(address: str, adapter: str, max_tokens: int) -> tuple[int, int]:
    """The revision served and the number of tokens of a greedy generation."""
    async with grpc.aio.insecure_channel(address) as channel:
        revision, count = 0, 0
        async for message in pb_grpc.InferenceServiceStub(channel).Generate(
            greedy(adapter, max_tokens), timeout=GUARD_S
        ):
            revision = revision or message.revision
            count += len(message.token_ids)
        return revision, count


def _narrowed_q_proj(files: dict[str, bytes]) -> dict[str, bytes]:
    """q_proj's lora_A keeps rank r but reads 64 inputs, where the model has 128."""
    tensors = load(files[WEIGHTS])
    for name in tensors:
        if ".q_proj.lora_A." in name:
            tensors[name] = tensors[name][:, :64].copy()
    return files | {WEIGHTS: save(tensors)}


async def test_adapter_with_shapes_wrong_for_the_model_is_nacked_and_the_engine_keeps_serving(
    server: InferenceProcess,
    module_store: RunningStore,
    tiny_adapter: TinyAdapterFactory,
    pytestconfig: pytest.Config,
) -> None:
    async with store_stub(module_store.address) as stub:
        await push(stub, "alpha", _narrowed_q_proj(adapter_files(tiny_adapter(seed=2))))
    add_figure(pytestconfig, "bad_inputs.incompatible_adapters")
    report = await _report(module_store, "alpha", 2)
    assert report.type == store_pb.REPORT_TYPE_NACK, server.log_text()[-4000:]
    assert report.last_error.code == FAILED_PRECONDITION
    assert await _generate(server.address, "alpha", 6) == (1, 6)


async def test_sigterm_turns_health_not_serving_and_running_streams_finish(
    server: InferenceProcess, pytestconfig: pytest.Config
) -> None:
    async with grpc.aio.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        first_health = (await anext(aiter(health))).status
        stub = pb_grpc.InferenceServiceStub(channel)
        streams = [stub.Generate(greedy("alpha", 300), timeout=GUARD_S) for _ in range(3)]
        for stream in streams:
            await anext(aiter(stream))
        server.terminate()
        add_figure(pytestconfig, "faults.sigterm_inference")
        async with asyncio.timeout(GUARD_S):
            second_health = (await anext(aiter(health))).status
        finished = [[m async for m in stream] for stream in streams]
    exit_code = await server.wait()
    assert (first_health, second_health) == (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    assert [rest[-1].finish_reason for rest in finished] == [pb.FINISH_REASON_LENGTH] * 3
    assert [rest[-1].usage.completion_tokens for rest in finished] == [300] * 3
    assert exit_code == 0
