"""`loraserve.clients`' watch events expose the traceparent the store sent with a
change as `trace_parent` (what a replica's sync continues the push's trace from),
"" when none came, and drop one longer than any traceparent can be."""

from __future__ import annotations

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.clients.storetypes import event_from_proto

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _event(trace_parent: str) -> pb.AdapterEvent:
    return pb.AdapterEvent(
        seq=3, type=pb.EVENT_TYPE_ADAPTER_DELETED, adapter_name="alpha", trace_parent=trace_parent
    )


def test_event_exposes_the_trace_parent() -> None:
    assert event_from_proto(_event(TRACEPARENT)).trace_parent == TRACEPARENT


def test_event_without_one_has_an_empty_trace_parent() -> None:
    assert event_from_proto(_event("")).trace_parent == ""


def test_trace_parent_over_its_bound_is_dropped() -> None:
    assert event_from_proto(_event("00-" + "f" * 200)).trace_parent == ""
