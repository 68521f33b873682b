"""Compiles a tree's `.proto` files with protoc and indexes what a client names in them."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from google.protobuf.descriptor_pb2 import (
    DescriptorProto,
    EnumDescriptorProto,
    FileDescriptorProto,
    FileDescriptorSet,
    ServiceDescriptorProto,
)
from grpc_tools import protoc


class CompileError(Exception):
    """protoc could not compile a tree."""


def compile_protos(proto_root: Path) -> FileDescriptorSet:
    """Every `.proto` under `proto_root`, compiled; files are named relative to it."""
    protos = sorted(str(path) for path in proto_root.rglob("*.proto"))
    if not protos:
        raise CompileError(f"no .proto files under {proto_root}")
    well_known = resources.files("grpc_tools") / "_proto"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "descriptors.binpb"
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--descriptor_set_out={out}",
            *protos,
        ]
        if protoc.main(args) != 0:
            raise CompileError(f"protoc could not compile {proto_root} (its errors are above)")
        return FileDescriptorSet.FromString(out.read_bytes())


@dataclass
class ProtoFile:
    """One file's declarations by full name (no leading dot), nested ones included."""

    descriptor: FileDescriptorProto
    # Map entry messages are left out: protoc makes them, a client never names them.
    messages: dict[str, DescriptorProto] = field(default_factory=dict)
    enums: dict[str, EnumDescriptorProto] = field(default_factory=dict)
    services: dict[str, ServiceDescriptorProto] = field(default_factory=dict)


@dataclass
class Contracts:
    """A compiled tree: its files by name, and every map entry by its `.full.name`."""

    files: dict[str, ProtoFile]
    map_entries: dict[str, DescriptorProto]

    def summary(self) -> str:
        """What a comparison against this tree covers, counted."""
        counts = {
            "files": len(self.files),
            "messages": sum(len(f.messages) for f in self.files.values()),
            "enums": sum(len(f.enums) for f in self.files.values()),
            "services": sum(len(f.services) for f in self.files.values()),
            "rpcs": sum(len(s.method) for f in self.files.values() for s in f.services.values()),
        }
        return ", ".join(f"{count} {what}" for what, count in counts.items())


def index(descriptors: FileDescriptorSet) -> Contracts:
    """Indexes a compiled tree."""
    contracts = Contracts(files={}, map_entries={})
    for file in descriptors.file:
        indexed = ProtoFile(file)
        prefix = f"{file.package}." if file.package else ""
        _index_messages(indexed, contracts.map_entries, prefix, file.message_type)
        for enum in file.enum_type:
            indexed.enums[prefix + enum.name] = enum
        for service in file.service:
            indexed.services[prefix + service.name] = service
        contracts.files[file.name] = indexed
    return contracts


def _index_messages(
    file: ProtoFile,
    map_entries: dict[str, DescriptorProto],
    prefix: str,
    messages: Iterable[DescriptorProto],
) -> None:
    for message in messages:
        name = prefix + message.name
        if message.options.map_entry:
            map_entries[f".{name}"] = message
            continue
        file.messages[name] = message
        for enum in message.enum_type:
            file.enums[f"{name}.{enum.name}"] = enum
        _index_messages(file, map_entries, f"{name}.", message.nested_type)
