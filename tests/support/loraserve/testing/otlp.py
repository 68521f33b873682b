"""An in-process OTLP trace receiver for tests: a real OTLP/gRPC TraceService on
127.0.0.1, port 0, that keeps every span exported to it, so a test can point services'
`--otlp-traces-endpoint` at it and read back what they traced."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from loraserve.testing.waiting import GUARD_S


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span and the `service.name` of the process that exported it."""

    service: str
    span: Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str:
        """ "" for a root span."""
        return self.span.parent_span_id.hex()

    @property
    def attributes(self) -> dict[str, Any]:
        return {kv.key: _value(kv.value) for kv in self.span.attributes}

    @property
    def links(self) -> list[tuple[str, str]]:
        """(trace id, span id) of each span this one links to."""
        return [(link.trace_id.hex(), link.span_id.hex()) for link in self.span.links]


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.received: list[ReceivedSpan] = []
        self.arrived = asyncio.Condition()

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            attributes = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            service = str(attributes.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                self.received.extend(ReceivedSpan(service, span) for span in scope_spans.spans)
        async with self.arrived:
            self.arrived.notify_all()
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    """What `otlp_receiver()` yields."""

    def __init__(self, endpoint: str, collector: _Collector) -> None:
        # Where exporters send spans: pass as `--otlp-traces-endpoint`.
        self.endpoint = endpoint
        self._collector = collector

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        """Every span received so far (those named `name`, if given), in arrival order."""
        return [s for s in self._collector.received if name is None or s.name == name]

    async def wait_for(
        self, name: str, count: int = 1, timeout: float = GUARD_S
    ) -> list[ReceivedSpan]:
        """Waits until at least `count` spans named `name` arrived and returns them; fails
        naming what is missing if they do not within `timeout` (a hang guard, not a
        measurement: exporters send in batches, on their own schedule)."""
        arrived = self._collector.arrived
        try:
            async with asyncio.timeout(timeout), arrived:
                await arrived.wait_for(lambda: len(self.spans(name)) >= count)
        except TimeoutError:
            seen = sorted({s.name for s in self.spans()})
            raise AssertionError(
                f"never received {count} span(s) named {name}; got {len(self.spans(name))}, "
                f"names seen: {seen}"
            ) from None
        return self.spans(name)


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """Runs an OTLP/gRPC trace receiver on a free loopback port until the block exits."""
    collector = _Collector()
    server = grpc.aio.server()
    # opentelemetry-proto's generated stubs carry no type hints.
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield OtlpReceiver(f"http://127.0.0.1:{port}", collector)
    finally:
        await server.stop(grace=None)
