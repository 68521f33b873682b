"""bench/front/grpclib_front.py and bench/front/native_front.py measure a transport, not a
different server: over grpclib and over the native transport (Rust's h2), with the engine's
outputs pulled or pushed, Generate streams what the grpc.aio servicer streams for the same
request, and refuses what it refuses with the same status, on the session's real engine.
Over the native transport a call its client cancels, loses its connection or runs out of
time is aborted in the engine, as over grpc.aio (tests/reliability/test_inference_requests.py)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from bench.front import grpc_floor_native, native_front
from bench.front.grpc_floor_native import Metadata, Write
from bench.front.grpclib_front import serve_generate
from loraserve.common.rpc.security import ServerSecurity, Token, TokenAuth
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.work import EngineWork, engine_work
from loraserve.testing.inference.app import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.store.server import RunningStore
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

# Tokens a cancelled request asks for: far more than the engine makes before a cancel
# reaches it, so vLLM's own count tells an aborted request from one left to run.
LONG = 450


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


@pytest.fixture(params=[pytest.param(kind, marks=native_only) for kind in ("native", "pushed")])
async def served_natively(
    request: pytest.FixtureRequest,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[tuple[RunningInference, int]]:
    """An inference server serving `alpha`, and the port of its Generate over the native
    transport, the engine's outputs pulled or pushed."""
    async with (
        inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=store_server.address,
            cache_dir=tmp_path / "cache",
            pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
        ) as running,
        _transport(request.param, running) as port,
    ):
        yield running, port


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
    async def failing(request: bytes, metadata: Metadata, write: Write) -> None:
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


async def _forever(request: bytes, metadata: Metadata, write: Write) -> None:
    write(pb.GenerateResponse(text="x").SerializeToString())
    await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def _front_watching_cancels() -> AsyncIterator[tuple[int, asyncio.Event]]:
    """A native front whose handler writes one message, then waits until cancelled; the
    event is set once it has been."""
    cancelled = asyncio.Event()

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        try:
            await _forever(request, metadata, write)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    front = grpc_floor_native.NativeFront(handler)
    try:
        yield front.port, cancelled
    finally:
        front.close()


@native_only
async def test_native_transport_cancels_the_handler_of_a_call_its_client_cancels() -> None:
    async with (
        _front_watching_cancels() as (port, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        assert (await call.read()).text == "x"
        call.cancel()
        await eventually(cancelled.is_set, "the handler cancelled")


@native_only
async def test_native_transport_cancels_the_handler_of_a_call_whose_connection_drops() -> None:
    async with (
        _front_watching_cancels() as (port, cancelled),
        tcp_proxy(port) as proxy,
        grpc.aio.insecure_channel(proxy.address) as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        assert (await call.read()).text == "x"
        proxy.cut()
        await eventually(cancelled.is_set, "the handler cancelled")


@native_only
async def test_native_transport_ends_a_call_past_its_deadline_and_cancels_its_handler() -> None:
    async with (
        _front_watching_cancels() as (port, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=0.2)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await messages(call)
        await eventually(cancelled.is_set, "the handler cancelled")
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


@native_only
async def test_native_transport_hands_its_handler_the_metadata_less_transport_headers() -> None:
    seen: list[Metadata] = []

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        seen.append(metadata)

    front = grpc_floor_native.NativeFront(handler)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            call = pb_grpc.InferenceServiceStub(channel).Generate(
                pb.GenerateRequest(),
                timeout=30,
                metadata=(("authorization", "Bearer s3cret"), ("x-rollout-key", "user-7")),
            )
            assert await messages(call) == []
    finally:
        front.close()
    assert ("authorization", "Bearer s3cret") in seen[0]
    assert ("x-rollout-key", "user-7") in seen[0]
    assert not {"content-type", "te", "grpc-timeout", "user-agent"} & {k for k, _ in seen[0]}


@pytest.mark.parametrize(
    ("metadata", "refusal"),
    [
        ((), "missing 'authorization: Bearer <token>' metadata"),
        ((("authorization", "Bearer wrong"),), "invalid bearer token"),
    ],
    ids=["no-token", "wrong-token"],
)
async def test_native_generate_with_auth_refuses_a_call_without_a_valid_token(
    served_natively: tuple[RunningInference, int],
    metadata: tuple[tuple[str, str], ...],
    refusal: str,
) -> None:
    running, _ = served_natively
    auth = TokenAuth(ServerSecurity(reader_tokens=(Token("team", "s3cret"),)), ())
    front = native_front.serve_generate(running.app.runtime_ref, auth=auth)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await messages(stub.Generate(greedy("alpha", 4), timeout=60, metadata=metadata))
            answered = await messages(
                stub.Generate(
                    greedy("alpha", 4), timeout=60, metadata=(("authorization", "Bearer s3cret"),)
                )
            )
    finally:
        front.close()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert refused.value.details() == refusal
    assert sum(len(message.token_ids) for message in answered) == 4
