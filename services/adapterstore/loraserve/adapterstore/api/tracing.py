"""Server spans of the store's calls that a push's trace goes through: the push
itself, and the download URLs each replica asks for when it loads the new revision.
Each continues the trace the caller sent in its metadata (a new one when it sent
none); the store's steps (validation, object storage, the commit) are their children."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry.trace import Span, SpanKind

from loraserve.adapterstore.files import PushHeader, PushResult
from loraserve.common.tracing import context_from, tracer

_TRACER = tracer(__name__)


@contextmanager
def server_span(
    step: str, service: str, method: str, context: grpc.aio.ServicerContext[Any, Any]
) -> Iterator[Span]:
    """`loraserve.store.<step>`, the span of one call of `method`, current for the block."""
    parent = context_from(context.invocation_metadata() or ())
    with _TRACER.start_as_current_span(
        f"loraserve.store.{step}", context=parent, kind=SpanKind.SERVER
    ) as span:
        if span.is_recording():
            span.set_attributes(
                {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
            )
        yield span


def describe_push(span: Span, header: PushHeader, principal: str) -> None:
    """The push's adapter, files and bytes; who pushed (`enduser.id`) when `principal`
    is given, which only `--trace-principals` does."""
    if span.is_recording():
        span.set_attributes(
            {
                "loraserve.adapter": header.name,
                "loraserve.files": len(header.files),
                "loraserve.bytes": sum(f.size for f in header.files),
            }
        )
        if principal:
            span.set_attribute("enduser.id", principal)


def describe_pushed(span: Span, result: PushResult) -> None:
    if span.is_recording():
        span.set_attributes(
            {
                "loraserve.revision": result.revision.revision,
                "loraserve.seq": result.seq,
                "loraserve.promoted": result.promoted,
            }
        )
