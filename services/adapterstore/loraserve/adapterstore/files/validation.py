"""What the store accepts at push: file names, sizes, the safetensors header, the PEFT config
(its LoRA scale included). The weights' values are checked as they stream, in `push`.

Every rejection is an InvalidArgument naming the file and the problem. The rules
are deliberately narrow: a file the inference service would refuse to load, or
one that could execute code when loaded (any pickle), never reaches storage.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from loraserve.common.config.textlimits import (
    MAX_BASE_MODEL_BYTES,
    MAX_FILE_NAME_BYTES,
    MAX_FILES,
    MAX_TARGET_MODULE_BYTES,
    MAX_TARGET_MODULES_BYTES,
    check_text,
)
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.lora_values import check_lora_scale
from loraserve.common.revisions.manifest import FileInfo
from loraserve.common.revisions.peft_format import (
    ALLOWED_FILES,
    CONFIG_FILE,
    LORA_DTYPES,
    LORA_TENSOR_NAMES,
    MAX_CONFIG_SIZE,
    PICKLE_SUFFIXES,
    RANK_AXIS,
    REQUIRED_FILES,
    WEIGHTS_FILE,
    TensorInfo,
    load_json_object,
    lora_tensor_name,
)

_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True)
class Limits:
    max_file_size: int
    max_adapter_size: int


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
    if len(files) > MAX_FILES:
        raise InvalidArgument(f"files: {len(files)} declared; the limit is {MAX_FILES} files")
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
    check_text(f"file name {name[:64]!r}", name, MAX_FILE_NAME_BYTES)
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


def parse_adapter_config(data: bytes) -> LoraConfig:
    name = CONFIG_FILE
    config = load_json_object(data, name)
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
    check_lora_scale(config)
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
        lora = lora_tensor_name(tensor.name)
        if lora is None:
            raise InvalidArgument(
                f"{WEIGHTS_FILE}: tensor {tensor.name!r} is not a LoRA weight (expected "
                f"{LORA_TENSOR_NAMES})"
            )
        module, side = lora.module, lora.side
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
        if len(shape) != 2 or shape[RANK_AXIS[side]] != config.rank or 0 in shape:
            expected = f"[{config.rank}, in]" if side == "A" else f"[out, {config.rank}]"
            raise InvalidArgument(
                f"{where}: tensor {tensor.name!r} has shape {list(shape)}; "
                f"lora_{side} must be {expected} for rank r={config.rank}"
            )
        sides.setdefault(module, set()).add(side)
    for module, present in sorted(sides.items()):
        if present != {"A", "B"}:
            missing = "lora_B" if "A" in present else "lora_A"
            raise InvalidArgument(f"{WEIGHTS_FILE}: module {module!r} has no {missing} weight")
