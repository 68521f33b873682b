"""Tracing inside the test process, for servers a test runs in-process (`inference_app`,
`running_store`): inside `exporting_spans(endpoint)` every span this process starts is
recorded and sent over OTLP/gRPC to `endpoint` (an `otlp_receiver`) as a server started
with `--otlp-traces-endpoint` sends its own; outside, tracing is off, exactly as in a
process that never started it.

Unlike `start_tracing`, it does not turn on `propagate()` (for good, process-wide): a
test's own channels that must carry its context add `TRACING_INTERCEPTORS` themselves.

OpenTelemetry takes one tracer provider per process, and the tracers modules took at
import (`tracer(__name__)`) bind to it at their first span. So the session gets one
provider, installed by the first block, whose tracers ask at every span start which
block is running: the block's own SDK provider, or OpenTelemetry's no-op tracer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.util import types

_NO_OP = trace.NoOpTracer()
# The provider of the running `exporting_spans` block; None outside one.
_active: SdkTracerProvider | None = None


class _SwitchingTracer(trace.Tracer):
    def __init__(self, name: str, version: str | None, schema_url: str | None) -> None:
        self._name, self._version, self._schema_url = name, version, schema_url

    def _now(self) -> trace.Tracer:
        if _active is None:
            return _NO_OP
        return _active.get_tracer(self._name, self._version, self._schema_url)

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._now().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._now().start_as_current_span(*args, **kwargs)


class _SwitchingProvider(trace.TracerProvider):
    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> trace.Tracer:
        return _SwitchingTracer(
            instrumenting_module_name, instrumenting_library_version, schema_url
        )


_SWITCHING = _SwitchingProvider()


def _install() -> None:
    provider = trace.get_tracer_provider()
    if provider is _SWITCHING:
        return
    if not isinstance(provider, trace.ProxyTracerProvider):
        raise RuntimeError(
            f"this test process already has a tracer provider ({provider!r}): something "
            "started tracing in-process, so `exporting_spans` cannot switch it"
        )
    trace.set_tracer_provider(_SWITCHING)


@asynccontextmanager
async def exporting_spans(
    endpoint: str, service_name: str = "loraserve-test"
) -> AsyncIterator[None]:
    """Records every span the process starts during the block and exports it to
    `endpoint` (OTLP/gRPC, insecure, in batches every 50 ms); on exit, what is left is
    flushed. The exporter runs on its own thread: a receiver on this event loop answers
    it while the test awaits."""
    global _active
    _install()
    provider = SdkTracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=endpoint, insecure=True), schedule_delay_millis=50
        )
    )
    _active = provider
    try:
        yield
    finally:
        _active = None
        # Flushing exports to a receiver that may run on this loop: not from the loop.
        await asyncio.to_thread(provider.shutdown)
