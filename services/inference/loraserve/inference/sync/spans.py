"""The replica's span of one change it applies, `loraserve.replica.sync`: a child of the
trace the store's event carried (the push's, so one trace follows a push through the
fleet), starting when the event arrived. Its first child, `loraserve.replica.event`,
is the event's wait for the adapter's worker; the cache and the registry add theirs
(download URLs, download, verify, engine load, route flip) under it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from loraserve.common.tracing import context_from_traceparent, tracer
from loraserve.inference.sync.state import AdapterWish

_TRACER = tracer(__name__)


@contextmanager
def applying(name: str, wish: AdapterWish, replica_id: str) -> Iterator[Span]:
    """The span of one attempt to apply the adapter's wish, current for the block (a
    root where the event carried no trace, or the wish came from a listing). Only the
    first attempt after an event starts when it arrived: a retry waited for nothing new."""
    received = _wall_ns(wish.received_at) if wish.received_at is not None else None
    wish.received_at = None
    with _TRACER.start_as_current_span(
        "loraserve.replica.sync",
        context=context_from_traceparent(wish.trace_parent),
        kind=SpanKind.CONSUMER,
        start_time=received,
    ) as span:
        if span.is_recording():
            span.set_attributes(_describe(name, wish, replica_id))
            if received is not None:
                _TRACER.start_span("loraserve.replica.event", start_time=received).end()
        yield span


def settled(span: Span, loaded: bool) -> None:
    """Says whether the wish's revision ended in the engine (False: only routed, so its
    first request loads it)."""
    if span.is_recording():
        span.set_attribute("loraserve.loaded", loaded)


def _describe(name: str, wish: AdapterWish, replica_id: str) -> dict[str, AttributeValue]:
    return {
        "loraserve.adapter": name,
        "loraserve.revision": wish.current.revision if wish.current is not None else 0,
        "loraserve.replica": replica_id,
        "loraserve.seq": max(wish.pending_seqs, default=0),
        "loraserve.delete": bool(wish.delete_seq),
        "loraserve.rollout": wish.rollout is not None,
    }


def _wall_ns(monotonic: float) -> int:
    """The wall-clock time (ns since the epoch, as spans take it) of a monotonic time."""
    return time.time_ns() - int((time.monotonic() - monotonic) * 1e9)
