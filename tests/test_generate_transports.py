"""Generate is one behaviour whatever carries it: over the service's native transport
(Rust's h2), with the engine's outputs pulled or pushed, and over bench/front/grpclib_front.py's
grpclib probe, it streams what the grpc.aio servicer streams for the same request, stops
where it stops, streams its logprobs, and refuses what it refuses with the same status,
on the session's real engine (the transports: loraserve.testing.inference.generate_fronts).
What the native transport does with a call that ends early is tested in
test_generate_transports_aborts.py, what else its port serves in
test_generate_transports_native.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.inference.app import RunningInference, greedy
from loraserve.testing.inference.generate_fronts import generate_transport as _transport
from loraserve.testing.inference.native import native_only
from loraserve.testing.streams import messages

pytestmark = pytest.mark.engine


@pytest.fixture(
    params=[
        "grpclib",
        pytest.param("native", marks=native_only),
        pytest.param("pushed", marks=native_only),
    ]
)
async def served(
    request: pytest.FixtureRequest, running_app: RunningInference
) -> AsyncIterator[tuple[RunningInference, Any]]:
    """An inference server serving `alpha` (`running_app`), and a stub on its Generate over
    the transport."""
    async with (
        _transport(request.param, running_app) as port,
        grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
    ):
        yield running_app, pb_grpc.InferenceServiceStub(channel)


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
