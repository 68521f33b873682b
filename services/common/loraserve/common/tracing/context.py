"""The W3C trace context as loraserve carries it: in gRPC metadata and HTTP headers
(`traceparent`, `tracestate`), and as one `traceparent` string where a trace crosses a
stored record (a push's commit, which replicas act on later)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

TRACEPARENT = "traceparent"
# A W3C traceparent is 55 characters; a stored or received one longer than this is no
# traceparent, and is dropped rather than kept or passed on.
MAX_TRACEPARENT_BYTES = 128
_PROPAGATOR = TraceContextTextMapPropagator()


def tracer(name: str) -> Tracer:
    """The tracer of module `name`: a no-op one until tracing is started."""
    return trace.get_tracer(name)


def context_from(metadata: Iterable[tuple[str, Any]]) -> otel_context.Context:
    """The trace context a caller sent (gRPC metadata or HTTP headers, keys lowercase);
    the empty context when it sent none or a malformed one."""
    carrier = {
        key: value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
        for key, value in metadata
        if key in ("traceparent", "tracestate")
    }
    return _PROPAGATOR.extract(carrier)


def context_from_traceparent(traceparent: str) -> otel_context.Context:
    """The context a stored `traceparent` names (empty when it names none)."""
    return context_from([(TRACEPARENT, traceparent)] if traceparent else [])


def current_traceparent() -> str:
    """The current span's `traceparent`, to store beside a record; "" when no span is
    recording (tracing off, or not sampled)."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get(TRACEPARENT, "")


def inject(metadata: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """`metadata` plus the current span's trace context, if any."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return [*metadata, *carrier.items()]


def link_to(traceparent: str) -> list[Link]:
    """A span link to the span a stored `traceparent` names ([] when none): how a
    request served by a revision points at the push that published it without being a
    child of that push."""
    span = trace.get_current_span(context_from_traceparent(traceparent))
    context = span.get_span_context()
    return [Link(context)] if context.is_valid else []


def bounded_traceparent(traceparent: str) -> str:
    """`traceparent`, or "" when it is longer than any traceparent can be."""
    if len(traceparent) > MAX_TRACEPARENT_BYTES:
        return ""
    return traceparent if len(traceparent.encode()) <= MAX_TRACEPARENT_BYTES else ""


@contextmanager
def child_span(
    tracer: Tracer, name: str, kind: SpanKind = SpanKind.INTERNAL, *, record_errors: bool = True
) -> Iterator[Span]:
    """A span under the current one, current for the block, only where the current
    one is recording; else the block runs under the current span as it is. Background
    work (the store's log polls) then makes no root traces of its own, and with
    tracing off a step costs one context lookup. Set attributes behind
    `span.is_recording()`. `record_errors` False: the block says itself which of its
    exceptions are failures (a storage 404 that answers "not there" is none)."""
    if not trace.get_current_span().is_recording():
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(
        name, kind=kind, record_exception=record_errors, set_status_on_exception=record_errors
    ) as span:
        yield span
