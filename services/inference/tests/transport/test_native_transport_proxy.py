"""The native transport carrying the calls it does not serve to upstream (a grpc.aio
server), or refusing them without one."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.inference.native import native_only
from loraserve.testing.inference.native_fronts import (
    echo_method,
    forever,
    front_before_upstream,
    native_front,
)
from loraserve.testing.inference.raw_h2 import RawClient
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually

pytestmark = native_only


async def test_native_transport_carries_a_stream_of_large_messages_both_ways_to_upstream() -> None:
    sent = [bytes([i]) * (1 << 20) for i in range(8)]

    async def requests() -> AsyncIterator[bytes]:
        for message in sent:
            yield message

    async with (
        front_before_upstream() as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = echo_method(channel, "Chat")(requests(), timeout=60)
        echoed = [message async for message in call]
        trailing = await call.trailing_metadata()
    assert echoed == sent
    assert ("x-seen", "8") in tuple(trailing)


async def test_native_transport_carries_upstreams_refusal_with_its_status_and_metadata() -> None:
    async with (
        front_before_upstream() as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await echo_method(channel, "Fail")(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == "no such thing: ü"
    assert ("x-why", "asked to") in tuple(refused.value.trailing_metadata() or ())


async def test_native_transport_carries_upstreams_status_when_it_refuses_a_call_streaming_in() -> (
    None
):
    async def requests() -> AsyncIterator[bytes]:
        # One message, then the request stream stays open: upstream refuses meanwhile.
        yield b"r"
        await asyncio.Event().wait()

    async with (
        front_before_upstream() as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await messages(echo_method(channel, "RefuseEarly")(requests(), timeout=60))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "no thanks"


async def test_native_transport_carries_the_calls_metadata_to_upstream() -> None:
    async with (
        front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = echo_method(channel, "Hang")(
            b"x", timeout=30, metadata=(("x-rollout-key", "user-7"),)
        )
        assert await call.read() == b"x"
        call.cancel()
    assert upstream.metadata == [("x-rollout-key", "user-7")]


async def test_native_transport_carries_the_deadline_to_upstream() -> None:
    # The raw client keeps no deadline of its own, and the front none for a carried call:
    # upstream's is the caller's or there is none.
    async with front_before_upstream() as (port, upstream):
        client = await asyncio.to_thread(RawClient, port)
        try:
            stream = client.call("/test.Echo/Hang", ("grpc-timeout", "1S"))
            await eventually(upstream.started.is_set, "upstream's handler running")
            # The caller's second, less the time the call took to get there.
            remaining = upstream.time_remaining
            assert remaining is not None, "upstream's call has no deadline"
            assert 0 < remaining <= 1.0
            trailers = await asyncio.to_thread(client.trailers, stream)
        finally:
            client.close()
    assert trailers[b"grpc-status"] == b"4"


async def test_native_transport_cancels_upstreams_call_when_its_client_cancels() -> None:
    async with (
        front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = echo_method(channel, "Hang")(b"x")
        assert await call.read() == b"x"
        call.cancel()
        await eventually(upstream.cancelled.is_set, "upstream's handler cancelled")


async def test_native_transport_cancels_upstreams_unary_call_when_its_client_cancels() -> None:
    async with (
        front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = echo_method(channel, "Sleep")(b"x")
        await eventually(upstream.started.is_set, "upstream's handler running")
        call.cancel()
        await eventually(upstream.cancelled.is_set, "upstream's handler cancelled")


async def test_native_transport_cancels_upstreams_call_when_its_clients_connection_drops() -> None:
    async with (
        front_before_upstream() as (port, upstream),
        tcp_proxy(port) as proxy,
        grpc.aio.insecure_channel(proxy.address) as channel,
    ):
        call = echo_method(channel, "Hang")(b"x")
        assert await call.read() == b"x"
        proxy.cut()
        await eventually(upstream.cancelled.is_set, "upstream's handler cancelled")


async def test_native_transport_ends_a_carried_call_unavailable_when_upstream_goes() -> None:
    async with (
        front_before_upstream() as (port, upstream),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        call = echo_method(channel, "Hang")(b"x", timeout=60)
        assert await call.read() == b"x"
        assert upstream.server is not None
        await upstream.server.stop(None)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_native_transport_keeps_a_client_that_stops_reading_from_holding_up_another() -> None:
    sent = [b"m" * (2 << 20)]

    async def requests() -> AsyncIterator[bytes]:
        for message in sent:
            yield message

    async with front_before_upstream() as (port, _):
        stalled = await asyncio.to_thread(RawClient, port)
        try:
            stream = stalled.call("/test.Echo/Flood")
            # HTTP/2's first window, taken and never given back: the flood stalls here.
            await asyncio.to_thread(stalled.read_data, stream, 65_535)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                echoed = await messages(echo_method(channel, "Chat")(requests(), timeout=60))
        finally:
            stalled.close()
    assert echoed == sent


async def test_native_transport_carries_calls_to_an_upstream_on_a_unix_socket(
    tmp_path: Path,
) -> None:
    async with (
        front_before_upstream(socket_path=tmp_path / "upstream.sock") as (port, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await echo_method(channel, "Fail")(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert refused.value.details() == "no such thing: ü"


async def test_native_transport_refuses_other_methods_unimplemented_without_upstream() -> None:
    front = native_front(forever)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.InferenceServiceStub(channel).GetServerInfo(
                    pb.GetServerInfoRequest(), timeout=30
                )
    finally:
        front.close()
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert refused.value.details() == (
        "method /loraserve.inference.v1.InferenceService/GetServerInfo is not served here"
    )


async def test_native_transport_answers_unavailable_when_upstream_cannot_be_reached() -> None:
    with socket.socket() as unused:
        # Bound and never listening: a port nothing answers on.
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        front = native_front(forever, upstream=address)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await echo_method(channel, "Fail")(b"", timeout=30)
        finally:
            front.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert (refused.value.details() or "").startswith(f"upstream {address} unreachable")
