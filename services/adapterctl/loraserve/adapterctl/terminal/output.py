"""Rendering results: aligned tables for people, JSON for scripts.

JSON keeps proto field names and, unlike `MessageToDict`, writes 64-bit integers as
numbers (revisions and seqs are far below 2**53) and timestamps as RFC 3339 strings.

Most of what adapterctl prints was written by someone else (descriptions, NACK and
abort reasons, `base_model_name_or_path`, error messages), so nothing reaches the
terminal unescaped: `printable` is applied by `Console` to every line and by `table`
to every cell, and `dumps` escapes what JSON itself leaves raw.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

_TIMESTAMP = Timestamp.DESCRIPTOR.full_name
# What a terminal acts on instead of showing: C0 controls and DEL (ESC starts every
# ANSI sequence), C1 controls (U+009B alone is a CSI on some terminals), the
# bidirectional marks, embeddings, overrides and isolates that reorder what follows,
# and the Unicode line and paragraph separators.
_C0 = r"\x00-\x1f"
_BEYOND_C0 = r"\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_UNSAFE_IN_LINE = re.compile(f"[{_C0}{_BEYOND_C0}]")
_UNSAFE_IN_TEXT = re.compile(rf"(?![\n\t])[{_C0}{_BEYOND_C0}]")
# JSON escapes C0 itself (with ensure_ascii off too) but leaves the rest raw.
_UNSAFE_IN_JSON = re.compile(f"[{_BEYOND_C0}]")
_NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
# ErrorStatus carries google.rpc.Code numbers.
_STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def printable(text: str, *, multiline: bool = False) -> str:
    """`text` with every character a terminal would act on written as its escape
    (`\\x1b`, `\\u202e`), so `\\x1b[2J` shows as those characters instead of
    clearing the screen. Newlines and tabs stay only in `multiline` text: a single
    line (a table cell, an event, an error) cannot forge the lines after it."""
    unsafe = _UNSAFE_IN_TEXT if multiline else _UNSAFE_IN_LINE
    return unsafe.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def status_code_name(code: int) -> str:
    """A google.rpc code number's name, e.g. 9 -> FAILED_PRECONDITION."""
    return _STATUS_NAMES.get(code, str(code))


def message_to_json(message: Message) -> dict[str, Any]:
    """Every field of `message`, set or not, as plain JSON values."""
    result: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.type == FieldDescriptor.TYPE_MESSAGE and not _is_repeated(field):
            # An unset sub-message is null, not a message of defaults.
            result[field.name] = _value(field, value) if message.HasField(field.name) else None
        elif _is_repeated(field):
            result[field.name] = [_value(field, item) for item in value]
        else:
            result[field.name] = _value(field, value)
    return result


def _is_repeated(field: Any) -> bool:
    return bool(field.is_repeated)


def _value(field: Any, value: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.message_type.full_name == _TIMESTAMP:
            return format_time(value, iso=True)
        return message_to_json(value)
    if field.type == FieldDescriptor.TYPE_ENUM:
        known = field.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if field.type == FieldDescriptor.TYPE_BYTES:
        return value.hex()
    return value


def dumps(data: Any) -> str:
    """One line of JSON, safe on a terminal: the characters `printable` escapes are
    `\\u` escapes in its strings, which JSON reads back as the same text."""
    text = json.dumps(data, sort_keys=False, ensure_ascii=False)
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def format_time(stamp: Timestamp, *, iso: bool = False) -> str:
    """A timestamp in UTC; empty when unset."""
    if stamp.seconds == 0 and stamp.nanos == 0:
        return ""
    when = datetime.fromtimestamp(stamp.seconds + stamp.nanos / 1e9, UTC)
    if iso:
        return when.isoformat().replace("+00:00", "Z")
    return when.strftime("%Y-%m-%d %H:%M:%SZ")


def format_size(size: int) -> str:
    """Bytes in binary units, e.g. `12.5 MiB`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns padded to their widest cell, two spaces apart; no trailing spaces.
    Cells are `printable` lines (padded as escaped), so a cell is one row's cell."""
    cells = [[str(h) for h in headers], *([printable(str(c)) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = (
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
    return "\n".join(lines)
