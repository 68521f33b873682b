"""What the service's native transport (Rust's h2) serves on its port beside Generate, on
the session's real engine: it refuses a call without a valid token and a request that
is not a GenerateRequest, and carries the service's other RPCs and health to the
grpc.aio server. The default transport (`--grpc-transport auto`) is grpc.aio, which
streams on after a peer sends a response header as a request."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.common.rpc.security import ServerSecurity, Token
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.inference.generate_fronts import native_generate_front as _native
from loraserve.testing.inference.native import native_only
from loraserve.testing.store.server import RunningStore
from loraserve.testing.streams import messages

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine


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
