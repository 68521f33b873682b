"""Over the service's native transport (Rust's h2), with the engine's outputs pulled or
pushed, a call its client cancels, loses its connection or runs out of time is aborted
in the engine, as over grpc.aio (tests/reliability/test_inference_requests.py), on the
session's real engine; many cancelled at once leave nothing running."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.engine.work import EngineWork, engine_work
from loraserve.testing.inference.app import RunningInference, greedy
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually

pytestmark = pytest.mark.engine

# Tokens a cancelled request asks for: far more than the engine makes before a cancel
# reaches it, so vLLM's own count tells an aborted request from one left to run.
LONG = 450


async def _work_once_idle(running: RunningInference, before: EngineWork) -> EngineWork:
    """What the engine did since `before`, read once it holds no request."""

    async def idle() -> bool:
        return await running.in_engine() == 0

    await eventually(idle, "the engine holding no request")
    return engine_work() - before


async def _read_tokens(call: Any, tokens: int) -> None:
    """Reads the call's stream until `tokens` tokens have come."""
    received = 0
    async for message in call:
        received += len(message.token_ids)
        if received >= tokens:
            return


@pytest.mark.parametrize("tokens", [1, 50], ids=lambda n: f"after-{n}-tokens")
async def test_native_transport_aborts_the_engine_request_of_a_call_its_client_cancels(
    served_natively: tuple[RunningInference, int], tokens: int
) -> None:
    running, port = served_natively
    before = engine_work()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pb_grpc.InferenceServiceStub(channel).Generate(greedy("alpha", LONG))
        await _read_tokens(call, tokens)
        call.cancel()
        work = await _work_once_idle(running, before)
    assert work.finished_requests == 0
    assert tokens <= work.generated_tokens < LONG


async def test_native_transport_aborts_the_engine_request_of_a_call_whose_connection_drops(
    served_natively: tuple[RunningInference, int],
) -> None:
    running, port = served_natively
    before = engine_work()
    async with (
        tcp_proxy(port) as proxy,
        grpc.aio.insecure_channel(proxy.address) as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(greedy("alpha", LONG))
        await _read_tokens(call, 1)
        proxy.cut()
        work = await _work_once_idle(running, before)
    assert work.finished_requests == 0
    assert work.generated_tokens < LONG


@pytest.mark.parametrize("deadline_s", [0.05, 0.5])
async def test_native_transport_ends_a_call_past_its_deadline_and_aborts_its_engine_request(
    served_natively: tuple[RunningInference, int], deadline_s: float
) -> None:
    running, port = served_natively
    before = engine_work()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pb_grpc.InferenceServiceStub(channel).Generate(
            greedy("alpha", LONG), timeout=deadline_s
        )
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await messages(call)
        work = await _work_once_idle(running, before)
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert work.finished_requests == 0
    assert work.generated_tokens < LONG


async def test_native_transport_leaves_nothing_running_when_many_clients_cancel_at_once(
    served_natively: tuple[RunningInference, int],
) -> None:
    running, port = served_natively
    before = engine_work()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        calls = [stub.Generate(greedy("alpha", LONG)) for _ in range(32)]
        await asyncio.gather(*(_read_tokens(call, 1 + i % 7) for i, call in enumerate(calls)))
        for call in calls:
            call.cancel()
        work = await _work_once_idle(running, before)
        after = await messages(stub.Generate(greedy("alpha", 4), timeout=60))
    assert work.finished_requests == 0
    assert sum(len(message.token_ids) for message in after) == 4
