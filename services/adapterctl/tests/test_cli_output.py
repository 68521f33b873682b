"""Rendering results as JSON and tables."""

from __future__ import annotations

import json

from google.protobuf.timestamp_pb2 import Timestamp

from loraserve.adapterctl.commands.read import describe_event
from loraserve.adapterctl.terminal.output import format_size, message_to_json, table
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb


def test_json_keeps_int64_fields_as_numbers() -> None:
    data = message_to_json(pb.Adapter(name="a", current_revision=3, latest_revision=4))
    assert data["current_revision"] == 3
    assert data["latest_revision"] == 4


def test_json_writes_timestamps_as_rfc3339_and_unset_messages_as_null() -> None:
    data = message_to_json(pb.Adapter(name="a", create_time=Timestamp(seconds=86400)))
    assert data["create_time"] == "1970-01-02T00:00:00Z"
    assert data["current"] is None
    assert json.loads(json.dumps(data)) == data


def test_json_writes_enum_names() -> None:
    event = pb.AdapterEvent(seq=1, type=pb.EVENT_TYPE_ADAPTER_DELETED, adapter_name="a")
    assert message_to_json(event)["type"] == "EVENT_TYPE_ADAPTER_DELETED"


def test_json_writes_repeated_messages_as_lists() -> None:
    revision = pb.Revision(files=[pb.FileInfo(name="x", size=2, sha256="ab")])
    assert message_to_json(revision)["files"] == [{"name": "x", "size": 2, "sha256": "ab"}]


def test_table_pads_columns_without_trailing_spaces() -> None:
    text = table(("NAME", "REV"), [("alpha", 1), ("b", "")])
    assert text.splitlines() == ["NAME   REV", "alpha  1", "b"]


def test_sizes_use_binary_units() -> None:
    assert format_size(512) == "512 B"
    assert format_size(3 * 1024 * 1024 // 2) == "1.5 MiB"


def test_event_line_names_the_change() -> None:
    event = pb.AdapterEvent(
        seq=7,
        type=pb.EVENT_TYPE_REVISION_PUSHED,
        adapter_name="alpha",
        revision=pb.Revision(adapter_name="alpha", revision=3),
        current_revision=3,
        actor="ci",
    )
    assert describe_event(event) == "seq=7 pushed alpha@3 current=3 by ci"
