"""Every channel loraserve opens (`secure_channel`) sends the caller's trace context
with each call, unary and streaming, with and without a bearer token, and nothing
when the caller is in no trace."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext

from loraserve.common.rpc.security import (
    ClientSecurity,
    ServerSecurity,
    parse_tokens,
    secure_channel,
)
from loraserve.common.tracing import context_from, propagate
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.grpc import serving

SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
# A provider of the test's own: spans that record, without the process's global one.
SPANS = TracerProvider().get_tracer(__name__)


class _Recorder(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Keeps the span context each call arrived in (0 for none)."""

    def __init__(self) -> None:
        self.span_ids: list[int] = []

    def _record(self, context: Any) -> None:
        span_context = _span_context(context.invocation_metadata() or ())
        self.span_ids.append(span_context.span_id if span_context.is_valid else 0)

    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:
        self._record(context)
        return pb.GetServerInfoResponse()

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[pb.GenerateResponse]:
        self._record(context)
        yield pb.GenerateResponse(text="a")


def _span_context(metadata: Any) -> SpanContext:
    return trace.get_current_span(context_from(metadata)).get_span_context()


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[_Recorder, int]]:
    # What start_tracing does in a process that records traces.
    propagate()
    servicer = _Recorder()
    security = ServerSecurity(reader_tokens=parse_tokens("r-secret", "reader"))

    def register(server: Any) -> None:
        pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)

    async with serving(register, [SERVICE], security=security) as server:
        yield servicer, server.port


async def _calls(port: int) -> None:
    async with secure_channel(f"127.0.0.1:{port}", ClientSecurity(token="r-secret")) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        await stub.GetServerInfo(pb.GetServerInfoRequest())
        async for _ in stub.Generate(pb.GenerateRequest()):
            pass


async def test_channel_sends_the_callers_span_with_every_call(
    recorder: tuple[_Recorder, int],
) -> None:
    servicer, port = recorder
    with SPANS.start_as_current_span("caller") as span:
        await _calls(port)
    assert servicer.span_ids == [span.get_span_context().span_id] * 2


async def test_channel_sends_no_trace_outside_one(recorder: tuple[_Recorder, int]) -> None:
    servicer, port = recorder
    await _calls(port)
    assert servicer.span_ids == [0, 0]
