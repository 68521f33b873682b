"""Rendering results as JSON and tables."""

from __future__ import annotations

import json

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from loraserve.adapterctl.commands.read import describe_event
from loraserve.adapterctl.terminal.output import (
    dumps,
    format_size,
    message_to_json,
    printable,
    table,
)
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.ctl import buffers, output


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


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),  # ANSI: ESC
        ("a\x00b\x07\x08", "a\\x00b\\x07\\x08"),  # C0
        ("\x7f", "\\x7f"),  # DEL
        ("\x9b2J", "\\x9b2J"),  # C1: a CSI on its own
        ("abc\u202edef\u2066x\u2069", "abc\\u202edef\\u2066x\\u2069"),  # bidi
        ("one\ntwo\tthree\r", "one\\ntwo\\tthree\\r"),
        ("caf\u00e9 \u65e5\u672c", "caf\u00e9 \u65e5\u672c"),  # printable text is kept
    ],
)
def test_printable_escapes_what_a_terminal_would_act_on(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_printable_multiline_text_keeps_newlines_and_tabs_only() -> None:
    assert printable("a\tb\nc\r\x1b[2J", multiline=True) == "a\tb\nc\\r\\x1b[2J"


def test_table_cells_are_escaped_before_they_are_padded() -> None:
    text = table(("NAME", "NOTE"), [("a\x1b", "x\ny"), ("bb", "z")])
    assert text.splitlines() == ["NAME   NOTE", "a\\x1b  x\\ny", "bb     z"]


def test_json_escapes_del_c1_and_bidi_and_reads_back_the_same() -> None:
    value = "\x1b[2J\x7f\x9b\u202e\u2028"
    text = dumps({"v": value})
    assert text == '{"v": "\\u001b[2J\\u007f\\u009b\\u202e\\u2028"}'
    assert json.loads(text) == {"v": value}


def test_console_errors_are_one_escaped_line() -> None:
    console = buffers()
    console.err("NOT_FOUND: \x1b[2Jgone\nadapterctl: forged")
    assert output(console.stderr) == "adapterctl: NOT_FOUND: \\x1b[2Jgone\\nadapterctl: forged\n"


def test_console_results_are_one_escaped_line_unless_multiline() -> None:
    console = buffers()
    console.out("seq=1 \x1b[2J\nseq=2")
    console.out("line 1\n\x9bline 2", multiline=True)
    assert output(console.stdout) == "seq=1 \\x1b[2J\\nseq=2\nline 1\n\\x9bline 2\n"
