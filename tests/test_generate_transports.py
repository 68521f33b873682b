"""Generate is one behaviour whatever carries it: over the service's native transport
(Rust's h2), with the engine's outputs pulled or pushed, and over bench/front/grpclib_front.py's
grpclib probe, it streams what the grpc.aio servicer streams for the same request, and
refuses what it refuses with the same status, on the session's real engine.
Over the native transport a call its client cancels, loses its connection or runs out of
time is aborted in the engine, as over grpc.aio (tests/reliability/test_inference_requests.py),
and its port serves the service's other RPCs and health, carried to the grpc.aio server."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.front.grpclib_front import serve_generate
from loraserve.common.rpc.security import ServerSecurity, Token
from loraserve.inference.serving import RuntimeRef
from loraserve.inference.transport import NativeFront, start_generate_front
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
from loraserve.testing.inference.native import native_only
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
# The app's own server is the reference: grpc.aio serves everything on it.
GRPCIO = ("--grpc-transport", "grpcio")


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
    front = _native(running.app.runtime_ref, pushed=kind == "pushed")
    try:
        yield front.port
    finally:
        front.close()


def _native(
    runtime_ref: RuntimeRef,
    *,
    pushed: bool = True,
    security: ServerSecurity | None = None,
    upstream: str | None = None,
) -> NativeFront:
    """Generate on the native transport, on an ephemeral port of 127.0.0.1."""
    return start_generate_front(
        runtime_ref,
        host="127.0.0.1",
        port=0,
        security=security or ServerSecurity(),
        upstream=upstream,
        max_connection_age_s=None,
        pushed=pushed,
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
            extra=GRPCIO,
            pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
        ) as running,
        _transport(request.param, running) as port,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield running, pb_grpc.InferenceServiceStub(channel)


@pytest.fixture
async def running_app(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[RunningInference]:
    """An inference server serving `alpha`, for tests that put a native front before it."""
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        extra=GRPCIO,
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
    ) as running:
        yield running


@pytest.fixture(params=[pytest.param(kind, marks=native_only) for kind in ("native", "pushed")])
async def served_natively(
    request: pytest.FixtureRequest, running_app: RunningInference
) -> AsyncIterator[tuple[RunningInference, int]]:
    """That server, and the port of its Generate over the native transport, the engine's
    outputs pulled or pushed."""
    async with _transport(request.param, running_app) as port:
        yield running_app, port


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


@native_only
@pytest.mark.parametrize(
    ("metadata", "refusal"),
    [
        ((), "missing 'authorization: Bearer <token>' metadata"),
        ((("authorization", "Bearer wrong"),), "invalid bearer token"),
    ],
    ids=["no-token", "wrong-token"],
)
async def test_native_generate_with_auth_refuses_a_call_without_a_valid_token(
    running_app: RunningInference,
    metadata: tuple[tuple[str, str], ...],
    refusal: str,
) -> None:
    security = ServerSecurity(reader_tokens=(Token("team", "s3cret"),))
    front = _native(running_app.app.runtime_ref, security=security)
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


@native_only
async def test_native_transport_serves_the_services_other_rpcs_and_health_on_its_port(
    running_app: RunningInference,
) -> None:
    front = _native(running_app.app.runtime_ref, upstream=running_app.address)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
            adapters = await stub.ListAdapters(pb.ListAdaptersRequest(), timeout=30)
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=30
            )
            answered = await messages(stub.Generate(greedy("alpha", 4), timeout=60))
    finally:
        front.close()
    over_aio = await running_app.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=30)
    assert info.replica_id == over_aio.replica_id
    assert adapters == await running_app.stub.ListAdapters(pb.ListAdaptersRequest(), timeout=30)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert sum(len(message.token_ids) for message in answered) == 4


async def test_native_generate_refuses_a_request_that_is_not_a_generate_request(
    served_natively: tuple[RunningInference, int],
) -> None:
    _, port = served_natively
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        generate: Any = channel.unary_stream("/loraserve.inference.v1.InferenceService/Generate")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await messages(generate(b"\xff\xff\xff", timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith("the request message does not parse")


def _send_a_response_header_as_a_request(port: int) -> bytes:
    """A peer with no token sends one request HEADERS frame carrying a response's
    `:status: 103`, then reads what the server answers until it closes the connection
    (or 10 s pass); returns those bytes."""
    import hpack

    def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
        return (
            len(payload).to_bytes(3, "big")
            + bytes([kind, flags])
            + stream.to_bytes(4, "big")
            + payload
        )

    headers = hpack.Encoder().encode([(":status", "103")])
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as peer:
        peer.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + frame(0x4, 0, 0, b"")
            + frame(0x1, 0x5, 1, headers)
        )
        with contextlib.suppress(OSError):
            while data := peer.recv(1 << 16):
                answer += data
    return answer


async def test_the_default_transport_streams_on_after_a_peer_sends_a_response_header(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> None:
    """`--grpc-transport auto` (the default) is grpc.aio, which refuses the frame on its
    connection alone: a stream running before it and a call after it are served whole
    (on the native transport every Generate of every client ended CANCELLED)."""
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
    ) as running:
        assert running.app.grpc_front.transport == "grpcio"
        before = running.stub.Generate(greedy("alpha", 64), timeout=120)
        first = await anext(aiter(before))
        await asyncio.to_thread(_send_a_response_header_as_a_request, running.app.port)
        after = await messages(running.stub.Generate(greedy("alpha", 4), timeout=120))
        rest = await messages(before)
    assert sum(len(m.token_ids) for m in [first, *rest]) == 64
    assert sum(len(m.token_ids) for m in after) == 4
