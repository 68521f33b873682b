"""Tracing one `adapterctl push`: the root span `loraserve.ctl.push` over hashing and
uploading, whose trace the store and every replica continue (the channel's
interceptors send it with each call), its trace id printed with `--trace`, and its
spans flushed before the command returns, whatever the outcome.

The spans come from a tracer provider of the push's own, not the process's global
one: OpenTelemetry lets a process set that once, and a command run in-process (the
tests, an embedding tool) would keep the first push's exporter for every later one.
The SDK is imported only when the push is traced: start-up is part of every push."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry.trace import INVALID_SPAN, Span, Tracer

from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.adapterctl.settings import PushTracing
from loraserve.adapterctl.terminal.console import Console
from loraserve.common.tracing import propagate, tracer

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

# Seconds the exporter may spend on one batch: a collector that does not answer
# delays the command's exit by about this much, not by the SDK's default 10 s.
_EXPORT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class PushTrace:
    """The traced push: its tracer (for the hashing and upload spans) and root span."""

    tracer: Tracer
    span: Span

    @property
    def trace_id(self) -> str:
        """The push's trace id (32 hex digits); "" when it is not recorded."""
        if not self.span.is_recording():
            return ""
        return f"{self.span.get_span_context().trace_id:032x}"

    def describe(self, files: AdapterFiles) -> None:
        if self.span.is_recording():
            self.span.set_attributes(
                {"loraserve.files": len(files.files), "loraserve.bytes": files.total_size}
            )


@asynccontextmanager
async def traced_push(
    tracing: PushTracing, name: str, console: Console
) -> AsyncIterator[PushTrace]:
    """Runs the block as the push's root span; prints its trace id with `--trace`."""
    if not tracing.on:
        yield PushTrace(tracer(__name__), INVALID_SPAN)
        return
    provider = _provider(tracing)
    propagate()
    try:
        own = provider.get_tracer(__name__)
        with own.start_as_current_span("loraserve.ctl.push") as span:
            span.set_attribute("loraserve.adapter", name)
            traced = PushTrace(own, span)
            if tracing.show:
                console.err(f"trace_id={traced.trace_id}")
            yield traced
    finally:
        # In a thread: the exporter blocks while it sends, and the collector may be
        # served by this very event loop (an in-process one, in tests).
        await asyncio.to_thread(provider.shutdown)


def _provider(tracing: PushTracing) -> TracerProvider:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased

    # --trace records the push whatever OTEL_TRACES_SAMPLER says: its id is printed.
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: tracing.service_name}),
        sampler=ParentBased(ALWAYS_ON) if tracing.show else None,
    )
    if tracing.endpoint is not None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        exporter = OTLPSpanExporter(
            endpoint=tracing.endpoint,
            insecure=tracing.endpoint.startswith("http://"),
            timeout=_EXPORT_TIMEOUT_S,
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
