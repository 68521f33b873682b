"""The traceparent a change's log entry keeps: written when the change was traced,
read back as written, "" from entries written before tracing, and dropped when it is
longer than any traceparent (128 bytes) rather than served to every watcher."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from loraserve.adapterstore.catalog import Change, ChangeType

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _change(trace_parent: str = "") -> Change:
    time = datetime(2026, 1, 2, tzinfo=UTC)
    return Change(
        1, ChangeType.ADAPTER_DELETED, "alpha", None, 0, time, "tester", trace_parent=trace_parent
    )


def _stored(change: Change) -> dict[str, object]:
    return json.loads(json.dumps(change.to_json()))  # type: ignore[no-any-return]


def test_entry_keeps_the_trace_parent() -> None:
    assert Change.from_json(_stored(_change(TRACEPARENT))).trace_parent == TRACEPARENT


def test_untraced_entry_writes_no_trace_parent() -> None:
    assert "trace_parent" not in _stored(_change())


def test_entry_written_before_tracing_reads_as_untraced() -> None:
    data = _stored(_change())
    assert Change.from_json(data).trace_parent == ""


def test_trace_parent_over_its_bound_is_dropped() -> None:
    data = _stored(_change(TRACEPARENT))
    data["trace_parent"] = "00-" + "a" * 200
    assert Change.from_json(data).trace_parent == ""
