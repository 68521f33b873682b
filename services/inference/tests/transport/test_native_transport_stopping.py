"""The native transport closing connections by GOAWAY: when it stops (its calls
given a grace), and once a connection is old."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import grpc
import hpack
import pytest

from loraserve.inference.serving import GENERATE_METHOD
from loraserve.inference.transport.native import Metadata, NativeFront, Write
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.inference.native import native_only
from loraserve.testing.inference.native_fronts import first_text, forever, native_front, x_then_y
from loraserve.testing.inference.raw_h2 import RawFrames, whole_call
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.testing.waiting import eventually

pytestmark = native_only


@contextlib.asynccontextmanager
async def _front_holding_calls() -> AsyncIterator[tuple[NativeFront, asyncio.Event, asyncio.Event]]:
    """A native front whose calls write "x", wait for the first event, then write "y";
    the second event is set once a call has been cancelled."""
    go_on, cancelled = asyncio.Event(), asyncio.Event()

    async def handler(request: bytes, metadata: Metadata, write: Write) -> None:
        write(pb.GenerateResponse(text="x").SerializeToString())
        try:
            await go_on.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        write(pb.GenerateResponse(text="y").SerializeToString())

    front = native_front(handler)
    try:
        yield front, go_on, cancelled
    finally:
        front.close()


async def _refused(port: int) -> bool:
    """Whether a call on a fresh connection to `port` is refused."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as fresh:
        try:
            await first_text(fresh)
        except grpc.aio.AioRpcError as e:
            return e.code() == grpc.StatusCode.UNAVAILABLE
    return False


async def test_native_transport_stopping_refuses_new_calls_and_lets_running_ones_finish() -> None:
    async with (
        _front_holding_calls() as (front, go_on, _),
        grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=60)
        assert (await call.read()).text == "x"
        stopping = asyncio.create_task(front.stop(30))
        await eventually(lambda: _refused(front.port), "a new connection refused")
        go_on.set()
        last = await call.read()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        await stopping
    assert last.text == "y"


async def test_native_transport_stopping_cancels_what_is_still_running_after_the_grace() -> None:
    async with (
        _front_holding_calls() as (front, _, cancelled),
        grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel,
    ):
        call = pb_grpc.InferenceServiceStub(channel).Generate(pb.GenerateRequest(), timeout=60)
        assert (await call.read()).text == "x"
        await front.stop(0.2)
        assert cancelled.is_set()
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await call.read()
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert ended.value.details() == "the server stopped before the call finished"


REFUSED_STREAM = 0x7


async def test_native_transport_refuses_a_call_upstream_cannot_take_while_it_stops() -> None:
    """Upstream stops with the transport: a call that comes on an open connection before
    its client has seen the GOAWAY was never processed, and is refused so that the
    client's channel sends it again on a new connection."""
    encoder, held = hpack.Encoder(), asyncio.Event()

    async def holding(request: bytes, metadata: Metadata, write: Write) -> None:
        held.set()
        await asyncio.Event().wait()

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        front = native_front(holding, upstream=f"127.0.0.1:{unused.getsockname()[1]}")
        peer = await asyncio.to_thread(RawFrames, front.port)
        try:
            # A call the stop waits for, so the connection stays open while it stops.
            await asyncio.to_thread(peer.send, whole_call(1, GENERATE_METHOD, encoder))
            await asyncio.wait_for(held.wait(), 30)
            stopping = asyncio.create_task(front.stop(30))
            # A graceful stop's first GOAWAY (last stream 2^31-1) still takes calls in
            # flight: sent once it came, this call stands for one that crossed it.
            assert await asyncio.to_thread(peer.goaway_code) == 0
            await asyncio.to_thread(peer.send, whole_call(3, "/test.Echo/Fail", encoder))
            code = await asyncio.to_thread(peer.reset_code, 3)
        finally:
            peer.close()
            front.close()
        await stopping
    assert code == REFUSED_STREAM


async def test_native_transport_stop_takes_any_grace() -> None:
    front = native_front(forever)
    await front.stop(float("inf"))


async def test_native_transport_stop_refuses_a_grace_that_is_not_a_number() -> None:
    front = native_front(forever)
    try:
        with pytest.raises(ValueError, match="grace must be a number of seconds or None"):
            await front.stop(float("nan"))
    finally:
        front.close()


async def test_native_transport_moves_new_calls_to_a_new_connection_once_one_is_old() -> None:
    go_on = asyncio.Event()
    front = native_front(x_then_y(go_on), max_connection_age_s=0.2)
    try:
        async with (
            tcp_proxy(front.port) as proxy,
            grpc.aio.insecure_channel(proxy.address) as channel,
        ):
            stub = pb_grpc.InferenceServiceStub(channel)
            old = stub.Generate(pb.GenerateRequest(), timeout=60)
            assert (await old.read()).text == "x"

            async def on_a_new_connection() -> bool:
                # Refused UNIMPLEMENTED (no upstream): what counts is the connection it took.
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
                return proxy.connections >= 2

            await eventually(on_a_new_connection, "a call on a new connection")
            go_on.set()
            last = await old.read()
            ended = await old.read()
            code = await old.code()
    finally:
        front.close()
    assert last.text == "y"
    assert ended is grpc.aio.EOF
    assert code == grpc.StatusCode.OK


@pytest.mark.parametrize("age", [-1.0, float("inf"), float("nan")])
async def test_native_transport_refuses_a_max_connection_age_it_cannot_keep(age: float) -> None:
    with pytest.raises(ValueError, match="max_connection_age_s must be seconds in"):
        native_front(forever, max_connection_age_s=age)
