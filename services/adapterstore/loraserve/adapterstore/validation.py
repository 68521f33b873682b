"""What the store accepts at push: file names, sizes, the safetensors header, the PEFT config.

Every rejection is an InvalidArgument naming the file and the problem. The rules
are deliberately narrow: a file the inference service would refuse to load, or
one that could execute code when loaded (any pickle), never reaches storage.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from loraserve.common.errors import InvalidArgument
from loraserve.common.manifest import FileInfo
from loraserve.common.textlimits import (
    MAX_BASE_MODEL_BYTES,
    MAX_TARGET_MODULE_BYTES,
    MAX_TARGET_MODULES_BYTES,
    check_text,
)

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
_SHA256 = re.compile(r"[0-9a-f]{64}")
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


@dataclass(frozen=True, slots=True)
class Limits:
    max_file_size: int
    max_adapter_size: int


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """What the store keeps from a PEFT LoRA config."""

    base_model: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]  # sorted, without duplicates


def check_declared_files(files: list[FileInfo], limits: Limits) -> None:
    """Checks a push header's file list before any byte is stored."""
    if not files:
        raise InvalidArgument(
            f"push declares no files; {WEIGHTS_FILE} and {CONFIG_FILE} are required"
        )
    seen: set[str] = set()
    total = 0
    for f in files:
        check_file_name(f.name)
        if f.name in seen:
            raise InvalidArgument(f"file {f.name!r} is declared twice")
        seen.add(f.name)
        if f.size < 0:
            raise InvalidArgument(f"file {f.name!r}: size {f.size} is negative")
        if f.size > limits.max_file_size:
            raise InvalidArgument(
                f"file {f.name!r}: size {f.size} exceeds the limit of {limits.max_file_size} bytes"
            )
        if f.name == CONFIG_FILE and f.size > MAX_CONFIG_SIZE:
            raise InvalidArgument(
                f"file {f.name!r}: size {f.size} exceeds the limit of {MAX_CONFIG_SIZE} bytes"
            )
        if f.sha256 and not _SHA256.fullmatch(f.sha256):
            raise InvalidArgument(f"file {f.name!r}: sha256 must be 64 lower-case hex digits")
        total += f.size
    if total > limits.max_adapter_size:
        raise InvalidArgument(
            f"adapter size {total} exceeds the limit of {limits.max_adapter_size} bytes"
        )
    missing = sorted(REQUIRED_FILES - seen)
    if missing:
        raise InvalidArgument(f"required file(s) missing: {', '.join(missing)}")


def check_file_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or "\0" in name or name in (".", ".."):
        raise InvalidArgument(f"file name {name!r} is not a plain base name; paths are not allowed")
    if name.lower().endswith(PICKLE_SUFFIXES):
        raise InvalidArgument(
            f"file {name!r} is a pickle-based format, which is never accepted: "
            f"convert the weights to {WEIGHTS_FILE}"
        )
    if name not in ALLOWED_FILES:
        raise InvalidArgument(
            f"file {name!r} is not allowed; allowed files: {', '.join(sorted(ALLOWED_FILES))}"
        )


def safetensors_header_length(prefix: bytes, file_size: int) -> int:
    """Reads the header length from the file's first 8 bytes and checks it fits the file."""
    if file_size < 8 or len(prefix) < 8:
        raise InvalidArgument(
            f"{WEIGHTS_FILE}: file of {file_size} bytes is too short to be safetensors"
        )
    (length,) = struct.unpack("<Q", prefix[:8])
    if length < 2:
        raise InvalidArgument(f"{WEIGHTS_FILE}: header length {length} is too small")
    if length > MAX_SAFETENSORS_HEADER:
        raise InvalidArgument(
            f"{WEIGHTS_FILE}: header length {length} exceeds {MAX_SAFETENSORS_HEADER} bytes"
        )
    if 8 + length > file_size:
        raise InvalidArgument(
            f"{WEIGHTS_FILE}: header length {length} runs past the end of the {file_size}-byte file"
        )
    return int(length)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _load_json_object(data: bytes, file_name: str) -> dict[str, Any]:
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
    entries = _load_json_object(header, f"{name} header")
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


def parse_adapter_config(data: bytes) -> LoraConfig:
    name = CONFIG_FILE
    config = _load_json_object(data, name)
    if config.get("peft_type") != "LORA":
        raise InvalidArgument(
            f"{name}: peft_type is {config.get('peft_type')!r}; only LORA adapters are accepted"
        )
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidArgument(f"{name}: r (the LoRA rank) must be an integer >= 1, got {rank!r}")
    alpha = config.get("lora_alpha")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise InvalidArgument(f"{name}: lora_alpha must be a finite number, got {alpha!r}")
    base_model = config.get("base_model_name_or_path")
    if not isinstance(base_model, str) or not base_model:
        raise InvalidArgument(f"{name}: base_model_name_or_path must be a non-empty string")
    check_text(f"{name}: base_model_name_or_path", base_model, MAX_BASE_MODEL_BYTES)
    targets = config.get("target_modules")
    if isinstance(targets, str):
        raise InvalidArgument(
            f"{name}: target_modules is the pattern {targets!r}; the store needs the explicit "
            'list of module names (e.g. ["q_proj", "v_proj"])'
        )
    if (
        not isinstance(targets, list)
        or not targets
        or not all(isinstance(t, str) and t for t in targets)
    ):
        raise InvalidArgument(f"{name}: target_modules must be a non-empty list of module names")
    for target in targets:
        check_text(f"{name}: target module {target[:64]!r}", target, MAX_TARGET_MODULE_BYTES)
    check_text(f"{name}: target_modules", "".join(targets), MAX_TARGET_MODULES_BYTES)
    if config.get("rank_pattern"):
        raise InvalidArgument(f"{name}: per-module ranks (rank_pattern) are not supported")
    if config.get("use_dora"):
        raise InvalidArgument(f"{name}: DoRA adapters (use_dora) are not supported")
    if config.get("modules_to_save"):
        raise InvalidArgument(
            f"{name}: modules_to_save is not supported; only LoRA weights are served"
        )
    return LoraConfig(base_model, rank, float(alpha), tuple(sorted(set(targets))))


def check_tensors_match_config(tensors: list[TensorInfo], config: LoraConfig) -> None:
    """Every tensor is a LoRA A or B weight of a targeted module, A is [r, in], B is
    [out, r], and each module has both."""
    where = f"{WEIGHTS_FILE} vs {CONFIG_FILE}"
    sides: dict[str, set[str]] = {}
    for tensor in tensors:
        match = _LORA_TENSOR.fullmatch(tensor.name)
        if match is None:
            raise InvalidArgument(
                f"{WEIGHTS_FILE}: tensor {tensor.name!r} is not a LoRA weight (expected "
                "base_model.model.<module>.lora_A.weight or .lora_B.weight)"
            )
        module, side = match["module"], match["side"]
        if not any(module == t or module.endswith("." + t) for t in config.target_modules):
            raise InvalidArgument(
                f"{where}: tensor {tensor.name!r} belongs to module {module!r}, which is not "
                f"in target_modules {list(config.target_modules)}"
            )
        if tensor.dtype not in LORA_DTYPES:
            raise InvalidArgument(
                f"{WEIGHTS_FILE}: tensor {tensor.name!r} has dtype {tensor.dtype}; "
                f"LoRA weights must be one of {sorted(LORA_DTYPES)}"
            )
        shape = tensor.shape
        if side == "A":
            ok, expected = len(shape) == 2 and shape[0] == config.rank, f"[{config.rank}, in]"
        else:
            ok, expected = len(shape) == 2 and shape[1] == config.rank, f"[out, {config.rank}]"
        if not ok or 0 in shape:
            raise InvalidArgument(
                f"{where}: tensor {tensor.name!r} has shape {list(shape)}; "
                f"lora_{side} must be {expected} for rank r={config.rank}"
            )
        sides.setdefault(module, set()).add(side)
    for module, present in sorted(sides.items()):
        if present != {"A", "B"}:
            missing = "lora_B" if "A" in present else "lora_A"
            raise InvalidArgument(f"{WEIGHTS_FILE}: module {module!r} has no {missing} weight")
