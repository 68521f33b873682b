"""Compares two compiled trees: what a client of the old one names must still be there,
in the same file, with the same meaning.

The rules are buf's FILE and WIRE_JSON breaking rules, by their names; additions (files,
messages, fields, enum values, services, RPCs) are compatible.
"""

from __future__ import annotations

from loraserve.protocompat.breaks import Break, changes
from loraserve.protocompat.descriptors import Contracts, ProtoFile
from loraserve.protocompat.fields import Scope, enum_value_breaks, field_breaks


def compare(old: Contracts, new: Contracts) -> list[Break]:
    """Every break of `new` against `old`, file by file."""
    breaks: list[Break] = []
    for name, old_file in sorted(old.files.items()):
        new_file = new.files.get(name)
        package = old_file.descriptor.package
        if new_file is None:
            breaks.append(Break(name, package, "FILE_NO_DELETE", "file deleted or renamed"))
            continue
        breaks.extend(
            changes(
                name,
                package,
                "file",
                [
                    ("FILE_SAME_PACKAGE", "package", package, new_file.descriptor.package),
                    ("FILE_SAME_SYNTAX", "syntax", _syntax(old_file), _syntax(new_file)),
                ],
            )
        )
        scopes = (_scope(old, old_file), _scope(new, new_file))
        breaks.extend(_message_breaks(name, old_file, new_file, scopes))
        breaks.extend(_enum_breaks(name, old_file, new_file))
        breaks.extend(_service_breaks(name, old_file, new_file))
    return breaks


def _syntax(file: ProtoFile) -> str:
    return file.descriptor.syntax or "proto2"


def _scope(contracts: Contracts, file: ProtoFile) -> Scope:
    return Scope(_syntax(file), contracts.map_entries)


def _message_breaks(
    name: str, old: ProtoFile, new: ProtoFile, scopes: tuple[Scope, Scope]
) -> list[Break]:
    breaks: list[Break] = []
    for full_name, message in old.messages.items():
        now = new.messages.get(full_name)
        if now is None:
            breaks.append(Break(name, full_name, "MESSAGE_NO_DELETE", "message deleted"))
        else:
            breaks.extend(field_breaks(name, full_name, message, now, scopes))
    return breaks


def _enum_breaks(name: str, old: ProtoFile, new: ProtoFile) -> list[Break]:
    breaks: list[Break] = []
    for full_name, enum in old.enums.items():
        now = new.enums.get(full_name)
        if now is None:
            breaks.append(Break(name, full_name, "ENUM_NO_DELETE", "enum deleted"))
        else:
            breaks.extend(enum_value_breaks(name, full_name, enum, now))
    return breaks


def _service_breaks(name: str, old: ProtoFile, new: ProtoFile) -> list[Break]:
    breaks: list[Break] = []
    for full_name, service in old.services.items():
        now = new.services.get(full_name)
        if now is None:
            breaks.append(Break(name, full_name, "SERVICE_NO_DELETE", "service deleted"))
            continue
        rpcs = {rpc.name: rpc for rpc in now.method}
        for rpc in service.method:
            what = f"{full_name}.{rpc.name}"
            new_rpc = rpcs.get(rpc.name)
            if new_rpc is None:
                breaks.append(Break(name, what, "RPC_NO_DELETE", "RPC deleted"))
                continue
            checks: list[tuple[str, str, object, object]] = [
                (
                    "RPC_SAME_REQUEST_TYPE",
                    "request type",
                    rpc.input_type[1:],
                    new_rpc.input_type[1:],
                ),
                (
                    "RPC_SAME_RESPONSE_TYPE",
                    "response type",
                    rpc.output_type[1:],
                    new_rpc.output_type[1:],
                ),
                (
                    "RPC_SAME_CLIENT_STREAMING",
                    "client streaming",
                    rpc.client_streaming,
                    new_rpc.client_streaming,
                ),
                (
                    "RPC_SAME_SERVER_STREAMING",
                    "server streaming",
                    rpc.server_streaming,
                    new_rpc.server_streaming,
                ),
            ]
            breaks.extend(changes(name, what, "RPC", checks))
    return breaks
