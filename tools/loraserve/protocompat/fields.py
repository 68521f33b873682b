"""The rules on a message's fields and an enum's values, and on what each reserves.

Fields and values are matched by number, as the wire matches them; a name a JSON client
sends counts too (buf's WIRE_JSON), and so do the name, type and presence generated code
exposes (buf's FILE).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from google.protobuf.descriptor_pb2 import (
    DescriptorProto,
    EnumDescriptorProto,
    FieldDescriptorProto,
)

from loraserve.protocompat.breaks import Break, changes

_NAMED_TYPES = (
    FieldDescriptorProto.TYPE_MESSAGE,
    FieldDescriptorProto.TYPE_ENUM,
    FieldDescriptorProto.TYPE_GROUP,
)


@dataclass(frozen=True)
class Scope:
    """What a field's type and presence depend on beyond the field: its file's syntax
    and the tree's map entries."""

    syntax: str
    map_entries: Mapping[str, DescriptorProto]

    def type_of(self, field: FieldDescriptorProto) -> str:
        """The field's type as written: a scalar, a full type name, or `map<K, V>`."""
        if field.type not in _NAMED_TYPES:
            return FieldDescriptorProto.Type.Name(field.type).removeprefix("TYPE_").lower()
        entry = self.map_entries.get(field.type_name)
        if entry is None:
            return field.type_name.lstrip(".")
        key, value = sorted(entry.field, key=lambda f: f.number)
        return f"map<{self.type_of(key)}, {self.type_of(value)}>"

    def cardinality(self, field: FieldDescriptorProto) -> str:
        """repeated, map, required, optional (explicit presence) or singular (implicit)."""
        if field.label == FieldDescriptorProto.LABEL_REPEATED:
            return "map" if field.type_name in self.map_entries else "repeated"
        if field.label == FieldDescriptorProto.LABEL_REQUIRED:
            return "required"
        implicit = (
            self.syntax == "proto3"
            and field.type != FieldDescriptorProto.TYPE_MESSAGE
            and not field.HasField("oneof_index")
        )
        return "singular" if implicit else "optional"


def _oneof(message: DescriptorProto, field: FieldDescriptorProto) -> str:
    # A proto3 `optional` sits in a synthetic oneof: presence, which cardinality covers.
    if not field.HasField("oneof_index") or field.proto3_optional:
        return "(none)"
    return message.oneof_decl[field.oneof_index].name


def field_breaks(
    file: str, name: str, old: DescriptorProto, new: DescriptorProto, scopes: tuple[Scope, Scope]
) -> list[Break]:
    """Every break among the old message's fields, and in what it reserves."""
    old_scope, new_scope = scopes
    new_fields = {field.number: field for field in new.field}
    new_numbers = {field.name: field.number for field in new.field}
    reserved = [(r.start, r.end) for r in new.reserved_range]
    breaks: list[Break] = []
    for field in old.field:
        what = f"{name}.{field.name}"
        now = new_fields.get(field.number)
        if now is None:
            gone = _gone(field.number, field.name, new_numbers, reserved, new.reserved_name)
            breaks.extend(
                Break(file, what, f"FIELD_{rule}", f"field {info}") for rule, info in gone
            )
            continue
        breaks.extend(
            changes(
                file,
                what,
                f"field {field.number}",
                [
                    ("FIELD_SAME_NAME", "name", field.name, now.name),
                    ("FIELD_SAME_JSON_NAME", "JSON name", field.json_name, now.json_name),
                    ("FIELD_SAME_TYPE", "type", old_scope.type_of(field), new_scope.type_of(now)),
                    (
                        "FIELD_SAME_CARDINALITY",
                        "cardinality",
                        old_scope.cardinality(field),
                        new_scope.cardinality(now),
                    ),
                    ("FIELD_SAME_ONEOF", "oneof", _oneof(old, field), _oneof(new, now)),
                ],
            )
        )
    old_reserved = [(r.start, r.end) for r in old.reserved_range]
    breaks.extend(
        _unreserved(file, name, "RESERVED_MESSAGE_NO_DELETE", (old_reserved, reserved), old, new)
    )
    return breaks


def enum_value_breaks(
    file: str, name: str, old: EnumDescriptorProto, new: EnumDescriptorProto
) -> list[Break]:
    """Every break among the old enum's values, and in what it reserves."""
    new_names: dict[int, set[str]] = {}
    for value in new.value:
        new_names.setdefault(value.number, set()).add(value.name)
    new_numbers = {value.name: value.number for value in new.value}
    # An enum's reserved ranges include their end; a message's do not.
    reserved = [(r.start, r.end + 1) for r in new.reserved_range]
    breaks: list[Break] = []
    for value in old.value:
        what = f"{name}.{value.name}"
        names = new_names.get(value.number)
        if names is None:
            gone = _gone(value.number, value.name, new_numbers, reserved, new.reserved_name)
            breaks.extend(
                Break(file, what, f"ENUM_VALUE_{rule}", f"value {info}") for rule, info in gone
            )
        elif value.name not in names:
            now = " or ".join(sorted(names))
            details = f"value {value.number} renamed from {value.name!r} to {now!r}"
            breaks.append(Break(file, what, "ENUM_VALUE_SAME_NAME", details))
    old_reserved = [(r.start, r.end + 1) for r in old.reserved_range]
    breaks.extend(
        _unreserved(file, name, "RESERVED_ENUM_NO_DELETE", (old_reserved, reserved), old, new)
    )
    return breaks


def _gone(
    number: int,
    name: str,
    new_numbers: Mapping[str, int],
    reserved: list[tuple[int, int]],
    reserved_names: Iterable[str],
) -> list[tuple[str, str]]:
    """(rule suffix, details) for a field or value whose number no longer exists."""
    moved = new_numbers.get(name)
    info = (
        f"{number} {name!r} deleted"
        if moved is None
        else f"{name!r} renumbered {number} to {moved}"
    )
    gone = []
    if not _covered(number, number + 1, reserved):
        gone.append(("NO_DELETE_UNLESS_NUMBER_RESERVED", f"{info} without reserving {number}"))
    # A name still in use elsewhere in the declaration is still understood by JSON clients.
    if moved is None and name not in reserved_names:
        gone.append(("NO_DELETE_UNLESS_NAME_RESERVED", f"{info} without reserving {name!r}"))
    return gone


def _unreserved(
    file: str,
    name: str,
    rule: str,
    ranges: tuple[list[tuple[int, int]], list[tuple[int, int]]],
    old: DescriptorProto | EnumDescriptorProto,
    new: DescriptorProto | EnumDescriptorProto,
) -> list[Break]:
    """A break for each number range or name the old declaration reserved and the new
    does not (ranges half-open)."""
    old_ranges, new_ranges = ranges
    breaks = [
        Break(file, name, rule, f"reserved numbers {start} to {end - 1} no longer all reserved")
        for start, end in old_ranges
        if not _covered(start, end, new_ranges)
    ]
    breaks.extend(
        Break(file, name, rule, f"reserved name {reserved!r} no longer reserved")
        for reserved in old.reserved_name
        if reserved not in new.reserved_name
    )
    return breaks


def _covered(start: int, end: int, ranges: Iterable[tuple[int, int]]) -> bool:
    """Whether the half-open ranges together hold every number of [start, end)."""
    # protoc refuses overlapping reserved ranges, so sorted ones only meet end to start.
    reached = start
    for low, high in sorted(ranges):
        if low > reached:
            break
        reached = high
    return reached >= end
