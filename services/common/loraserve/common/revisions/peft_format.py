"""What a PEFT LoRA adapter looks like on disk: its file names, the safetensors
header of its weights, the names and shapes of its tensors.

Facts about the format only, for the store (what it accepts at push), adapterctl
(whether a directory is complete) and the inference service (whether an adapter
fits the served model); each decides for itself what to do with them. Format
errors are InvalidArgument naming the file.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loraserve.common.errors import InvalidArgument

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
REQUIRED_FILES = frozenset({CONFIG_FILE, WEIGHTS_FILE})
OPTIONAL_FILES = frozenset(
    {
        "README.md",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "tokenizer.model",
        "vocab.json",
        "merges.txt",
        "added_tokens.json",
    }
)
ALLOWED_FILES = REQUIRED_FILES | OPTIONAL_FILES
# Formats that unpickle (and so may run code) when loaded.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# A PEFT config is a few hundred bytes; the bound only keeps it out of the way of memory.
MAX_CONFIG_SIZE = 1024 * 1024
# The same bound the safetensors library applies to its JSON header.
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024
DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
LORA_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
# PEFT's saved names: base_model.model.<module path>.lora_A.weight / lora_B.weight
_LORA_TENSOR = re.compile(r"base_model\.model\.(?P<module>.+)\.lora_(?P<side>[AB])\.weight")
LORA_TENSOR_NAMES = "base_model.model.<module>.lora_A.weight or .lora_B.weight"

Side = Literal["A", "B"]


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class LoraTensorName:
    module: str  # the adapted layer's path in the model, e.g. model.layers.0.self_attn.q_proj
    side: Side


def lora_tensor_name(name: str) -> LoraTensorName | None:
    """The layer and side a PEFT LoRA weight belongs to; None if `name` is not one."""
    match = _LORA_TENSOR.fullmatch(name)
    if match is None:
        return None
    return LoraTensorName(match["module"], "A" if match["side"] == "A" else "B")


# The axis of a LoRA weight that is its rank: lora_A is [r, in_features], lora_B is
# [out_features, r].
RANK_AXIS: dict[Side, int] = {"A": 0, "B": 1}


def lora_shape(side: Side, rank: int, layer: tuple[int, int]) -> tuple[int, int]:
    """The shape of the lora_`side` weight of rank `rank` for a layer of shape
    (out_features, in_features)."""
    out_features, in_features = layer
    return (rank, in_features) if side == "A" else (out_features, rank)


def safetensors_header_length(prefix: bytes, file_size: int, name: str = WEIGHTS_FILE) -> int:
    """Reads the header length from the file's first 8 bytes and checks it fits the file."""
    if file_size < 8 or len(prefix) < 8:
        raise InvalidArgument(f"{name}: file of {file_size} bytes is too short to be safetensors")
    (length,) = struct.unpack("<Q", prefix[:8])
    if length < 2:
        raise InvalidArgument(f"{name}: header length {length} is too small")
    if length > MAX_SAFETENSORS_HEADER:
        raise InvalidArgument(
            f"{name}: header length {length} exceeds {MAX_SAFETENSORS_HEADER} bytes"
        )
    if 8 + length > file_size:
        raise InvalidArgument(
            f"{name}: header length {length} runs past the end of the {file_size}-byte file"
        )
    return int(length)


# Deeper JSON than any PEFT config or safetensors header has (they nest 3 levels) is
# refused before parsing: the parser and everything that walks its result recurse,
# and a file nested 100,000 deep would otherwise end in a RecursionError.
MAX_JSON_DEPTH = 64
# A JSON string (skipped whole: brackets inside it do not nest), or a run of brackets.
_JSON_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[{]+|[\]}]+')


def check_json_depth(data: bytes, file_name: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raises InvalidArgument naming `file_name` when `data` nests arrays and objects
    deeper than `max_depth`. Linear in the size of `data`; parses nothing."""
    depth = 0
    for match in _JSON_NESTING.finditer(data):
        token = match.group()
        if token[0] in b"[{":
            depth += len(token)
            if depth > max_depth:
                raise InvalidArgument(f"{file_name}: JSON nested more than {max_depth} levels deep")
        elif token[0] in b"]}":
            depth -= len(token)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def load_json_object(data: bytes, file_name: str) -> dict[str, Any]:
    """A JSON object, refusing duplicate keys (two readers could disagree on them) and
    nesting deeper than MAX_JSON_DEPTH. Every reader of an adapter's JSON files (the
    store, adapterctl, the inference service) parses them here."""
    check_json_depth(data, file_name)
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as e:
        raise InvalidArgument(f"{file_name}: not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise InvalidArgument(f"{file_name}: must be a JSON object")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_safetensors_header(header: bytes, file_size: int) -> list[TensorInfo]:
    """Parses the JSON header and checks every tensor's dtype, shape and offsets, and that
    the offsets tile the data section exactly: no gap, no overlap, nothing after."""
    name = WEIGHTS_FILE
    if not header.startswith(b"{"):
        raise InvalidArgument(f"{name}: header does not start with a JSON object")
    entries = load_json_object(header, f"{name} header")
    metadata = entries.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise InvalidArgument(f"{name}: __metadata__ must map strings to strings")
    if not entries:
        raise InvalidArgument(f"{name}: contains no tensors")
    tensors = [_parse_tensor_entry(key, value) for key, value in entries.items()]
    data_size = file_size - 8 - len(header)
    position = 0
    for tensor in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if tensor.begin != position:
            problem = "overlaps the previous tensor" if tensor.begin < position else "leaves a gap"
            raise InvalidArgument(
                f"{name}: tensor {tensor.name!r} at offset {tensor.begin} {problem} "
                f"(expected offset {position})"
            )
        position = tensor.end
    if position != data_size:
        raise InvalidArgument(
            f"{name}: tensors cover {position} bytes but the data section has {data_size} bytes"
        )
    return tensors


def _parse_tensor_entry(key: str, value: Any) -> TensorInfo:
    where = f"{WEIGHTS_FILE}: tensor {key!r}"
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise InvalidArgument(f"{where}: entry must have exactly dtype, shape and data_offsets")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise InvalidArgument(f"{where}: unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise InvalidArgument(f"{where}: shape must be a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise InvalidArgument(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end")
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if offsets[1] - offsets[0] != expected:
        raise InvalidArgument(
            f"{where}: data_offsets span {offsets[1] - offsets[0]} bytes but "
            f"{dtype}{shape} needs {expected}"
        )
    return TensorInfo(key, dtype, tuple(shape), offsets[0], offsets[1])


def matrix_shapes(file: Path) -> dict[str, tuple[int, int]]:
    """The shape of every 2-D tensor in a safetensors file, by tensor name, from its
    header alone. Blocking: reads the file's first bytes."""
    with file.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        if length > MAX_SAFETENSORS_HEADER:
            raise InvalidArgument(f"{file}: safetensors header of {length} bytes is too large")
        header = load_json_object(fh.read(length), f"{file} safetensors header")
    header.pop("__metadata__", None)
    shapes: dict[str, tuple[int, int]] = {}
    for name, info in header.items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if isinstance(shape, list) and len(shape) == 2:
            shapes[name] = (int(shape[0]), int(shape[1]))
    return shapes


def linear_weight_shapes(model_dir: Path) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of every `<module path>.weight` matrix in a model
    checkpoint's safetensors files, by module path: its linear layers and embeddings."""
    shapes: dict[str, tuple[int, int]] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        for name, shape in matrix_shapes(file).items():
            module, dot, last = name.rpartition(".")
            if dot and last == "weight":
                shapes[module] = shape
    return shapes
