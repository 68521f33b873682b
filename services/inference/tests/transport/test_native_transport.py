"""The native transport (loraserve.inference.transport.native) and its handlers (no
engine): what a handler is given, and how a call ends."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from loraserve.inference.serving import GENERATE_METHOD
from loraserve.inference.transport.native import Ending, Metadata, Write
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.inference.native import native_only
from loraserve.testing.inference.native_fronts import (
    first_text,
    front_watching_cancels,
    front_watching_starts,
    native_front,
    recording,
    recording_stub,
)
from loraserve.testing.inference.raw_h2 import RawClient
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually

pytestmark = native_only


async def test_native_transport_ends_a_call_internal_when_its_handler_fails() -> None:
    async def failing(request: bytes, metadata: Metadata, write: Write) -> None:
        write(pb.GenerateResponse(text="x").SerializeToString())
        raise RuntimeError("a bug in the handler")

    front = native_front(failing)
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


async def test_native_transport_ends_a_failed_call_with_its_status_and_trailing_metadata() -> None:
    async def refused(request: bytes, metadata: Metadata, write: Write) -> None:
        raise RuntimeError("over quota")

    def status(exc: Exception) -> Ending:
        return 8, str(exc), [("retry-after", "3"), ("grpc-status", "0"), ("bad key", "x")]

    front = native_front(refused, status)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            call = stub.Generate(pb.GenerateRequest(), timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call.read()
    finally:
        front.close()
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert failed.value.details() == "over quota"
    assert ("retry-after", "3") in tuple(failed.value.trailing_metadata() or ())


async def test_native_transport_lets_grpc_retry_a_call_ended_before_its_first_message() -> None:
    # Response headers sent before a message would commit the call (gRPC's retry policy
    # and a proxy between both stop there); a trailers-only response does not.
    attempts = 0

    async def unavailable_once(request: bytes, metadata: Metadata, write: Write) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise RuntimeError("engine lost")
        write(pb.GenerateResponse(text="x").SerializeToString())

    def status(exc: Exception) -> Ending:
        return grpc.StatusCode.UNAVAILABLE.value[0], str(exc), []

    retry = {
        "name": [{"service": "loraserve.inference.v1.InferenceService"}],
        "retryPolicy": {
            "maxAttempts": 2,
            "initialBackoff": "0.01s",
            "maxBackoff": "0.01s",
            "backoffMultiplier": 1,
            "retryableStatusCodes": ["UNAVAILABLE"],
        },
    }
    options = [("grpc.service_config", json.dumps({"methodConfig": [retry]}))]
    front = native_front(unavailable_once, status)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}", options) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            responses = [r async for r in stub.Generate(pb.GenerateRequest(), timeout=30)]
    finally:
        front.close()
    assert [r.text for r in responses] == ["x"]
    assert attempts == 2


async def test_native_transport_cancels_the_handler_of_a_call_its_client_cancels() -> None:
    async with (
        front_watching_cancels() as (port, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        assert (await call.read()).text == "x"
        call.cancel()
        await eventually(cancelled.is_set, "the handler cancelled")


async def test_native_transport_cancels_the_handler_of_a_call_whose_connection_drops() -> None:
    async with (
        front_watching_cancels() as (port, cancelled),
        tcp_proxy(port) as proxy,
        grpc.aio.insecure_channel(proxy.address) as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        assert (await call.read()).text == "x"
        proxy.cut()
        await eventually(cancelled.is_set, "the handler cancelled")


async def test_native_transport_cancels_a_handler_yet_to_write_when_its_client_cancels() -> None:
    async with (
        front_watching_starts() as (port, started, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest())
        await eventually(started.is_set, "the handler running")
        call.cancel()
        await eventually(cancelled.is_set, "the handler cancelled")


async def test_native_transport_ends_a_call_its_handler_cancels_with_a_status() -> None:
    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        raise asyncio.CancelledError

    front = native_front(handler)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as ended:
                await first_text(channel)
    finally:
        front.close()
    assert ended.value.code() == grpc.StatusCode.CANCELLED
    assert ended.value.details() == "the call was cancelled on the server"


async def test_native_transport_ends_a_call_past_its_deadline_itself() -> None:
    async with front_watching_starts() as (port, _, _):
        client = await asyncio.to_thread(RawClient, port)
        try:
            stream = client.call(GENERATE_METHOD, ("grpc-timeout", "1S"))
            trailers = await asyncio.to_thread(client.trailers, stream)
        finally:
            client.close()
    assert trailers[b"grpc-status"] == b"4"


async def test_native_transport_hands_its_handler_the_metadata_less_transport_headers() -> None:
    async with recording_stub() as (stub, seen):
        call = stub.Generate(
            pb.GenerateRequest(),
            timeout=30,
            metadata=(("authorization", "Bearer s3cret"), ("x-rollout-key", "user-7")),
        )
        assert await messages(call) == []
    _, metadata = seen[0]
    assert ("authorization", "Bearer s3cret") in metadata
    assert ("x-rollout-key", "user-7") in metadata
    assert not {"content-type", "te", "grpc-timeout", "user-agent"} & {k for k, _ in metadata}


@pytest.mark.parametrize(
    ("target", "authority"),
    [("ipv4:{address},{address}", None), ("{address}", "/run/loraserve/grpc.sock")],
    ids=["address-list", "socket-path"],
)
async def test_native_transport_serves_a_call_whose_authority_is_no_uri_authority(
    target: str, authority: str | None
) -> None:
    """grpc core sends an `ipv4:` target's address list ("A,B") as the authority, and
    grpc-java a Unix socket's path; gRPC's own servers serve both."""
    seen: list[tuple[bytes, Metadata]] = []
    front = native_front(recording(seen))
    address = f"127.0.0.1:{front.port}"
    options = [("grpc.default_authority", authority)] if authority else []
    try:
        async with grpc.aio.insecure_channel(target.format(address=address), options) as channel:
            call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=30)
            assert await messages(call) == []
            assert await call.code() == grpc.StatusCode.OK
    finally:
        front.close()
    assert len(seen) == 1
