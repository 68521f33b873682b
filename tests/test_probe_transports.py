"""bench/front/grpclib_front.py and bench/front/native_front.py measure a transport, not a
different server: over grpclib and over the native transport (Rust's h2), with the engine's
outputs pulled or pushed, Generate streams what the grpc.aio servicer streams for the same
request, and refuses what it refuses with the same status, on the session's real engine."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from bench.front import grpc_floor_native, native_front
from bench.front.grpclib_front import serve_generate
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.store.server import RunningStore
from loraserve.testing.streams import messages

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine


def _native_buildable() -> bool:
    return shutil.which("cargo") is not None and any(
        Path(grpc_floor_native.DEBIAN_CRATES).glob("h2-0.3.*")
    )


@contextlib.asynccontextmanager
async def _transport(kind: str, running: RunningInference) -> AsyncIterator[int]:
    """The port of Generate served again over `kind`, beside the app's own server."""
    if kind == "grpclib":
        server, port = await serve_generate(running.app.runtime_ref)
        try:
            yield port
        finally:
            server.close()
            await server.wait_closed()
        return
    front = native_front.serve_generate(running.app.runtime_ref, pushed=kind == "pushed")
    try:
        yield front.port
    finally:
        front.close()


native_only = pytest.mark.skipif(
    not _native_buildable(),
    reason="the native probe needs cargo and Debian's crates (bench/front/native/README.md)",
)


@pytest.fixture(
    params=[
        "grpclib",
        pytest.param("native", marks=native_only),
        pytest.param("pushed", marks=native_only),
    ]
)
async def served(
    request: pytest.FixtureRequest,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[tuple[RunningInference, Any]]:
    """An inference server serving `alpha`, and a stub on its Generate over the transport."""
    async with (
        inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=store_server.address,
            cache_dir=tmp_path / "cache",
            pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
        ) as running,
        _transport(request.param, running) as port,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield running, pb_grpc.InferenceServiceStub(channel)


def _folded(responses: list[pb.GenerateResponse]) -> pb.GenerateResponse:
    """The whole stream as one message, less the server's request id. How tokens split
    into messages depends on timing (steps that arrive while a write is pending leave
    together), so that split is not compared."""
    folded = pb.GenerateResponse()
    for response in responses:
        text = folded.text + response.text
        folded.MergeFrom(response)
        folded.text = text
    folded.ClearField("request_id")
    return folded


async def _folded_over_both(
    served: tuple[RunningInference, Any], request: pb.GenerateRequest
) -> tuple[pb.GenerateResponse, pb.GenerateResponse]:
    """The request's stream folded, over the grpc.aio servicer and over the other transport."""
    running, other_stub = served
    over_aio = await messages(running.stub.Generate(request, timeout=60))
    over_other = await messages(other_stub.Generate(request, timeout=60))
    return _folded(over_aio), _folded(over_other)


@pytest.mark.parametrize("adapter", ["alpha", ""])
async def test_generate_over_another_transport_streams_what_the_servicer_streams(
    served: tuple[RunningInference, Any], adapter: str
) -> None:
    running, other_stub = served
    request = greedy(adapter, 12)
    over_aio = [r async for r in running.stub.Generate(request, timeout=60)]
    over_other = [r async for r in other_stub.Generate(request, timeout=60)]
    assert over_aio[0].request_id
    assert over_other[0].request_id
    folded = _folded(over_aio)
    assert len(folded.token_ids) == 12
    assert _folded(over_other) == folded


async def test_generate_over_another_transport_stops_where_the_servicer_stops(
    served: tuple[RunningInference, Any],
) -> None:
    unstopped, _ = await _folded_over_both(served, greedy("alpha", 12))
    request = greedy("alpha", 12)
    request.sampling.stop_token_ids.append(unstopped.token_ids[4])
    over_aio, over_other = await _folded_over_both(served, request)
    assert over_aio.finish_reason == pb.FINISH_REASON_STOP
    assert over_other == over_aio


async def test_generate_over_another_transport_streams_the_servicers_logprobs(
    served: tuple[RunningInference, Any],
) -> None:
    request = greedy("alpha", 6)
    request.sampling.logprobs = 2
    over_aio, over_other = await _folded_over_both(served, request)
    assert len(over_aio.logprobs) == 6
    assert over_other == over_aio


async def test_generate_over_another_transport_refuses_with_the_servicers_status(
    served: tuple[RunningInference, Any],
) -> None:
    running, other_stub = served
    request = greedy("nosuch", 4)
    with pytest.raises(grpc.aio.AioRpcError) as over_aio:
        _ = [r async for r in running.stub.Generate(request, timeout=60)]
    with pytest.raises(grpc.aio.AioRpcError) as over_other:
        _ = [r async for r in other_stub.Generate(request, timeout=60)]
    assert over_aio.value.code() == grpc.StatusCode.NOT_FOUND
    assert over_other.value.code() == over_aio.value.code()
    assert over_other.value.details() == over_aio.value.details()


@native_only
async def test_native_transport_ends_a_call_internal_when_its_handler_fails() -> None:
    async def failing(request: bytes, rollout_key: str, write: grpc_floor_native.Write) -> None:
        write(pb.GenerateResponse(text="x").SerializeToString())
        raise RuntimeError("a bug in the handler")

    front = grpc_floor_native.NativeFront(failing)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            call = stub.Generate(pb.GenerateRequest(), timeout=30)
            first = await call.read()
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call.read()
        assert first.text == "x"
        assert failed.value.code() == grpc.StatusCode.INTERNAL
    finally:
        front.close()
