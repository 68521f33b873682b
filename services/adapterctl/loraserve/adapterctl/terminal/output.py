"""Rendering results: aligned tables for people, JSON for scripts.

JSON keeps proto field names and, unlike `MessageToDict`, writes 64-bit integers as
numbers (revisions and seqs are far below 2**53) and timestamps as RFC 3339 strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

_TIMESTAMP = Timestamp.DESCRIPTOR.full_name
# ErrorStatus carries google.rpc.Code numbers.
_STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


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
    return json.dumps(data, sort_keys=False, ensure_ascii=False)


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
    """Columns padded to their widest cell, two spaces apart; no trailing spaces."""
    cells = [[str(h) for h in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = (
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
    return "\n".join(lines)
