"""Each compatibility rule reports its break, and additions report none: an old and a new
tiny tree of protos, compiled with protoc and compared."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from loraserve.protocompat.breaks import Break
from loraserve.protocompat.descriptors import Contracts, compile_protos, index
from loraserve.protocompat.rules import compare

FILE = "demo/v1/demo.proto"
HEADER = 'syntax = "proto3";\npackage demo.v1;\n'


def _compile(root: Path, files: Mapping[str, str]) -> Contracts:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return index(compile_protos(root))


def _breaks(
    tmp: Path, old: str, new: str, *, old_file: str = FILE, new_file: str = FILE
) -> list[Break]:
    """The breaks of `new` against `old` (declarations after the proto3 header)."""
    before = _compile(tmp / "old", {old_file: HEADER + old})
    after = _compile(tmp / "new", {new_file: HEADER + new})
    return compare(before, after)


def _rules(tmp: Path, old: str, new: str) -> list[str]:
    return [found.rule for found in _breaks(tmp, old, new)]


MESSAGE = "message M {{ {} }}\nmessage A {{}}\nmessage B {{}}\nenum E {{ E_ZERO = 0; }}\n"
SERVICE = "message Req {{}}\nmessage Resp {{}}\nservice S {{ {} }}\n"


def _fields(old: str, new: str) -> tuple[str, str]:
    return MESSAGE.format(old), MESSAGE.format(new)


def test_a_break_names_its_file_declaration_rule_and_what_changed(tmp_path: Path) -> None:
    breaks = _breaks(tmp_path, *_fields("int32 x = 1;", "int64 x = 1;"))
    assert [str(found) for found in breaks] == [
        "proto/demo/v1/demo.proto:demo.v1.M.x: FIELD_SAME_TYPE: "
        "field 1 type changed from 'int32' to 'int64'"
    ]


def test_a_renamed_file_breaks(tmp_path: Path) -> None:
    breaks = _breaks(tmp_path, "message M {}", "message M {}", new_file="demo/v1/other.proto")
    assert [(found.file, found.rule) for found in breaks] == [(FILE, "FILE_NO_DELETE")]


def test_a_changed_package_breaks(tmp_path: Path) -> None:
    before = _compile(tmp_path / "old", {FILE: HEADER})
    after = _compile(tmp_path / "new", {FILE: 'syntax = "proto3";\npackage demo.v2;\n'})
    assert [found.rule for found in compare(before, after)] == ["FILE_SAME_PACKAGE"]


def test_a_changed_syntax_breaks(tmp_path: Path) -> None:
    before = _compile(tmp_path / "old", {FILE: HEADER})
    after = _compile(tmp_path / "new", {FILE: 'syntax = "proto2";\npackage demo.v1;\n'})
    assert [found.rule for found in compare(before, after)] == ["FILE_SAME_SYNTAX"]


def test_a_deleted_message_breaks(tmp_path: Path) -> None:
    assert _rules(tmp_path, "message M {}\nmessage N {}", "message M {}") == ["MESSAGE_NO_DELETE"]


def test_a_deleted_nested_message_breaks(tmp_path: Path) -> None:
    assert _rules(tmp_path, "message M { message N {} }", "message M {}") == ["MESSAGE_NO_DELETE"]


def test_a_deleted_nested_enum_breaks(tmp_path: Path) -> None:
    old, new = "message M { enum E { E_ZERO = 0; } }", "message M {}"
    assert _rules(tmp_path, old, new) == ["ENUM_NO_DELETE"]


def test_a_deleted_enum_breaks(tmp_path: Path) -> None:
    assert _rules(tmp_path, "enum E { E_ZERO = 0; }", "") == ["ENUM_NO_DELETE"]


def test_a_deleted_service_breaks(tmp_path: Path) -> None:
    old, new = SERVICE.format("") + "service T {}", SERVICE.format("")
    assert _rules(tmp_path, old, new) == ["SERVICE_NO_DELETE"]


def test_a_deleted_rpc_breaks(tmp_path: Path) -> None:
    old = SERVICE.format("rpc Get(Req) returns (Resp); rpc Put(Req) returns (Resp);")
    new = SERVICE.format("rpc Get(Req) returns (Resp);")
    assert _rules(tmp_path, old, new) == ["RPC_NO_DELETE"]


@pytest.mark.parametrize(
    ("new_rpc", "rule"),
    [
        ("rpc Get(Resp) returns (Resp);", "RPC_SAME_REQUEST_TYPE"),
        ("rpc Get(Req) returns (Req);", "RPC_SAME_RESPONSE_TYPE"),
        ("rpc Get(stream Req) returns (Resp);", "RPC_SAME_CLIENT_STREAMING"),
        ("rpc Get(Req) returns (stream Resp);", "RPC_SAME_SERVER_STREAMING"),
    ],
    ids=["request", "response", "client-streaming", "server-streaming"],
)
def test_a_changed_rpc_signature_breaks(tmp_path: Path, new_rpc: str, rule: str) -> None:
    old, new = SERVICE.format("rpc Get(Req) returns (Resp);"), SERVICE.format(new_rpc)
    assert _rules(tmp_path, old, new) == [rule]


def test_a_field_deleted_without_reserving_its_number_breaks(tmp_path: Path) -> None:
    old, new = _fields("int32 x = 1; int32 y = 2;", 'int32 x = 1; reserved "y";')
    assert _rules(tmp_path, old, new) == ["FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"]


def test_a_field_deleted_without_reserving_its_name_breaks(tmp_path: Path) -> None:
    old, new = _fields("int32 x = 1; int32 y = 2;", "int32 x = 1; reserved 2;")
    assert _rules(tmp_path, old, new) == ["FIELD_NO_DELETE_UNLESS_NAME_RESERVED"]


def test_a_field_deleted_with_number_and_name_reserved_is_compatible(tmp_path: Path) -> None:
    old, new = _fields("int32 x = 1; int32 y = 2;", 'int32 x = 1; reserved 2; reserved "y";')
    assert _rules(tmp_path, old, new) == []


def test_a_renumbered_field_breaks(tmp_path: Path) -> None:
    old, new = _fields("int32 x = 1;", "int32 x = 2;")
    assert _rules(tmp_path, old, new) == ["FIELD_NO_DELETE_UNLESS_NUMBER_RESERVED"]


def test_a_number_reused_with_another_name_breaks(tmp_path: Path) -> None:
    old, new = _fields("int32 x = 1;", "int32 y = 1;")
    assert _rules(tmp_path, old, new) == ["FIELD_SAME_NAME", "FIELD_SAME_JSON_NAME"]


def test_a_changed_json_name_breaks(tmp_path: Path) -> None:
    old, new = _fields("int32 x = 1;", 'int32 x = 1 [json_name = "ex"];')
    assert _rules(tmp_path, old, new) == ["FIELD_SAME_JSON_NAME"]


@pytest.mark.parametrize(
    ("old_field", "new_field"),
    [
        ("int32 x = 1;", "uint32 x = 1;"),
        ("A x = 1;", "B x = 1;"),
        ("E x = 1;", "int32 x = 1;"),
        ("map<int32, float> x = 1;", "map<string, float> x = 1;"),
        ("map<string, A> x = 1;", "map<string, B> x = 1;"),
    ],
    ids=["scalar", "message", "enum", "map-key", "map-value"],
)
def test_a_changed_field_type_breaks(tmp_path: Path, old_field: str, new_field: str) -> None:
    assert _rules(tmp_path, *_fields(old_field, new_field)) == ["FIELD_SAME_TYPE"]


def test_a_field_made_repeated_breaks(tmp_path: Path) -> None:
    old, new = _fields("A x = 1;", "repeated A x = 1;")
    assert _rules(tmp_path, old, new) == ["FIELD_SAME_CARDINALITY"]


def test_a_map_made_a_repeated_entry_breaks(tmp_path: Path) -> None:
    old = "message M { map<string, int32> x = 1; }"
    new = "message M { message XEntry { string key = 1; int32 value = 2; } repeated XEntry x = 1; }"
    assert "FIELD_SAME_CARDINALITY" in _rules(tmp_path, old, new)


def test_a_field_given_presence_breaks(tmp_path: Path) -> None:
    old, new = _fields("int32 x = 1;", "optional int32 x = 1;")
    assert _rules(tmp_path, old, new) == ["FIELD_SAME_CARDINALITY"]


def test_a_field_moved_into_a_oneof_breaks(tmp_path: Path) -> None:
    old, new = _fields("A x = 1;", "oneof choice { A x = 1; }")
    assert _rules(tmp_path, old, new) == ["FIELD_SAME_ONEOF"]


def test_a_field_moved_out_of_a_oneof_breaks(tmp_path: Path) -> None:
    old, new = _fields("oneof choice { A x = 1; B y = 2; }", "A x = 1; oneof choice { B y = 2; }")
    assert _rules(tmp_path, old, new) == ["FIELD_SAME_ONEOF"]


ENUM = "enum E {{ E_ZERO = 0; {} }}\n"


def _values(old: str, new: str) -> tuple[str, str]:
    return ENUM.format(old), ENUM.format(new)


def test_an_enum_value_deleted_without_reservation_breaks(tmp_path: Path) -> None:
    assert _rules(tmp_path, *_values("E_ONE = 1;", "")) == [
        "ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED",
        "ENUM_VALUE_NO_DELETE_UNLESS_NAME_RESERVED",
    ]


def test_an_enum_value_deleted_with_reservation_is_compatible(tmp_path: Path) -> None:
    assert _rules(tmp_path, *_values("E_ONE = 1;", 'reserved 1; reserved "E_ONE";')) == []


def test_a_renumbered_enum_value_breaks(tmp_path: Path) -> None:
    assert _rules(tmp_path, *_values("E_ONE = 1;", "E_ONE = 2;")) == [
        "ENUM_VALUE_NO_DELETE_UNLESS_NUMBER_RESERVED"
    ]


def test_a_renamed_enum_value_breaks(tmp_path: Path) -> None:
    assert _rules(tmp_path, *_values("E_ONE = 1;", "E_UNO = 1;")) == ["ENUM_VALUE_SAME_NAME"]


def test_a_message_reserved_number_no_longer_reserved_breaks(tmp_path: Path) -> None:
    old, new = _fields("reserved 3 to 5;", "reserved 3, 5;")
    assert _rules(tmp_path, old, new) == ["RESERVED_MESSAGE_NO_DELETE"]


def test_a_message_reserved_name_no_longer_reserved_breaks(tmp_path: Path) -> None:
    old, new = _fields('reserved "gone";', "")
    assert _rules(tmp_path, old, new) == ["RESERVED_MESSAGE_NO_DELETE"]


def test_an_enum_reservation_no_longer_kept_breaks(tmp_path: Path) -> None:
    old, new = _values('reserved 2 to 3; reserved "E_GONE";', "reserved 2;")
    assert _rules(tmp_path, old, new) == ["RESERVED_ENUM_NO_DELETE", "RESERVED_ENUM_NO_DELETE"]


def test_additions_are_compatible(tmp_path: Path) -> None:
    old = MESSAGE.format("int32 x = 1; reserved 5;") + SERVICE.format(
        "rpc Get(Req) returns (Resp);"
    )
    new = (
        MESSAGE.format(
            'int32 x = 1; reserved 4 to 6; reserved "old"; string added = 7; map<string, A> m = 8;'
            " oneof pick { A a = 9; B b = 10; } optional int32 maybe = 11; message Inner {}"
        )
        + SERVICE.format("rpc Get(Req) returns (Resp); rpc Watch(Req) returns (stream Resp);")
        + "message Added { int32 y = 1; }\nenum F { F_ZERO = 0; }\nservice T {}\n"
    )
    before = _compile(tmp_path / "old", {FILE: HEADER + old})
    after = _compile(
        tmp_path / "new", {FILE: HEADER + new, "demo/v1/more.proto": HEADER + "message More {}"}
    )
    assert compare(before, after) == []
