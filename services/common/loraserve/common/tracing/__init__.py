"""OpenTelemetry traces across the fleet: off unless configured (`--otlp-traces-endpoint`
or the standard `OTEL_*` environment), W3C trace context carried in gRPC metadata and
HTTP headers, and the ids of the current span on every log line."""

from loraserve.common.tracing.context import (
    MAX_TRACEPARENT_BYTES,
    TRACEPARENT,
    bounded_traceparent,
    child_span,
    context_from,
    context_from_traceparent,
    current_traceparent,
    inject,
    link_to,
    tracer,
)
from loraserve.common.tracing.propagation import (
    TRACING_INTERCEPTORS,
    propagate,
    tracing_interceptors,
)
from loraserve.common.tracing.setup import (
    LOG_FORMAT,
    TracingSettings,
    add_tracing_flags,
    otlp_endpoint,
    start_tracing,
    tracing_from_args,
)

__all__ = [
    "LOG_FORMAT",
    "MAX_TRACEPARENT_BYTES",
    "TRACEPARENT",
    "TRACING_INTERCEPTORS",
    "TracingSettings",
    "add_tracing_flags",
    "bounded_traceparent",
    "child_span",
    "context_from",
    "context_from_traceparent",
    "current_traceparent",
    "inject",
    "link_to",
    "otlp_endpoint",
    "propagate",
    "start_tracing",
    "tracer",
    "tracing_from_args",
    "tracing_interceptors",
]
