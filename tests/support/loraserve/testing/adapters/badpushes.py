"""Pushes the store must refuse, each with a fragment of the message it must give."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from safetensors.numpy import save

from loraserve.adapterstore.files.push import Chunk
from loraserve.common.revisions.manifest import FileInfo
from loraserve.testing.adapters.files import (
    AdapterFiles,
    lora_config,
    lora_tensors,
    raw_safetensors,
    tiny_adapter,
)
from loraserve.testing.adapters.pushes import declared
from loraserve.testing.store.stores import TEST_LIMITS


def _one_tensor(dtype: str, shape: list[int], offsets: list[int], data: bytes) -> bytes:
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    return raw_safetensors({name: {"dtype": dtype, "shape": shape, "data_offsets": offsets}}, data)


@dataclass(frozen=True)
class BadPush:
    """A push the store must refuse, and a fragment of the message it must give."""

    id: str
    files: AdapterFiles
    message: str
    header_files: list[FileInfo] | None = None
    chunks: list[Chunk] | None = None


def _with(**files: bytes) -> AdapterFiles:
    return tiny_adapter() | {k.replace("__", "."): v for k, v in files.items()}


def _without(name: str) -> AdapterFiles:
    return {k: v for k, v in tiny_adapter().items() if k != name}


def _weights_renamed(old: str, new: str) -> bytes:
    tensors = lora_tensors()
    return save({k.replace(old, new): v for k, v in tensors.items()})


def _weights_reshaped(name_part: str, shape: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(1)
    tensors = lora_tensors()
    for key in tensors:
        if name_part in key:
            tensors[key] = rng.standard_normal(shape, np.float32)
    return save(tensors)


def _valid_weights_header() -> tuple[dict[str, Any], bytes]:
    weights = tiny_adapter()["adapter_model.safetensors"]
    (length,) = struct.unpack("<Q", weights[:8])
    return json.loads(weights[8 : 8 + length]), weights[8 + length :]


def _weights_with_data(extra: int) -> bytes:
    header, data = _valid_weights_header()
    return raw_safetensors(header, data + b"\0" * extra if extra > 0 else data[:extra])


# The tensor whose element [3, 1] the value tests change.
_POISONED = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"


def _weights_holding(value: float, dtype: str) -> bytes:
    """The tiny adapter's weights in `dtype` (F16, BF16, F32 or F64), one entry `value`."""
    tensors = lora_tensors()
    tensors[_POISONED][3, 1] = value
    if dtype == "BF16":  # numpy has no bfloat16: the upper halves of the float32 values
        header: dict[str, Any] = {}
        data = b""
        for name, array in sorted(tensors.items()):
            raw = (array.view(np.uint32) >> 16).astype("<u2").tobytes()
            header[name] = {
                "dtype": "BF16",
                "shape": list(array.shape),
                "data_offsets": [len(data), len(data) + len(raw)],
            }
            data += raw
        return raw_safetensors(header, data)
    numpy_type = {"F16": np.float16, "F32": np.float32, "F64": np.float64}[dtype]
    return save({name: array.astype(numpy_type) for name, array in tensors.items()})


def _nan_then_cut() -> list[Chunk]:
    """The config, then the weights only up to a NaN in the first tensor's data: a
    store that checks values as they stream refuses it before the rest is sent."""
    weights = bytearray(tiny_adapter()[WEIGHTS])
    (length,) = struct.unpack("<Q", weights[:8])
    nan_at = 8 + length + 4 * 5  # element 5 of the first tensor (F32)
    weights[nan_at : nan_at + 4] = struct.pack("<f", float("nan"))
    return [
        Chunk(CONFIG, 0, tiny_adapter()[CONFIG]),
        Chunk(WEIGHTS, 0, bytes(weights[: nan_at + 4])),
    ]


def _declared_with(name: str, **changes: Any) -> list[FileInfo]:
    return [
        FileInfo(**{"name": f.name, "size": f.size, "sha256": f.sha256, **changes})
        if f.name == name
        else f
        for f in declared(tiny_adapter())
    ]


def nested_json(depth: int) -> bytes:
    """A JSON object holding arrays nested `depth` deep: parsed naively, a RecursionError."""
    return b'{"x":' + b"[" * depth + b"]" * depth + b"}"


def weights_with_nested_header(depth: int) -> bytes:
    header = nested_json(depth)
    return struct.pack("<Q", len(header)) + header


NAN, INF = float("nan"), float("inf")
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
BAD_PUSHES = [
    BadPush("pickle-bin", _with(pytorch_model__bin=b"x"), "pickle-based format"),
    BadPush("pickle-pt", _with(adapter__pt=b"x"), "pickle-based format"),
    BadPush("pickle-pkl", _with(state__pkl=b"x"), "pickle-based format"),
    BadPush("unknown-file", _with(model__onnx=b"x"), "is not allowed"),
    BadPush("path-name", tiny_adapter() | {"../README.md": b"x"}, "paths are not allowed"),
    BadPush("missing-config", _without(CONFIG), "required file(s) missing: adapter_config.json"),
    BadPush("missing-weights", _without(WEIGHTS), f"required file(s) missing: {WEIGHTS}"),
    BadPush(
        "header-not-json",
        _with(adapter_model__safetensors=struct.pack("<Q", 4) + b"{abc"),
        "not valid JSON",
    ),
    BadPush(
        "header-too-long",
        _with(adapter_model__safetensors=struct.pack("<Q", 999) + b"{}"),
        "runs past the end",
    ),
    BadPush("file-too-short", _with(adapter_model__safetensors=b"abc"), "too short"),
    BadPush(
        "data-truncated",
        _with(adapter_model__safetensors=_weights_with_data(-4)),
        "data section has",
    ),
    BadPush(
        "data-trailing", _with(adapter_model__safetensors=_weights_with_data(4)), "data section has"
    ),
    BadPush(
        "offsets-gap",
        _with(adapter_model__safetensors=_one_tensor("F32", [1, 2], [8, 16], b"\0" * 16)),
        "leaves a gap",
    ),
    BadPush(
        "offsets-vs-shape",
        _with(adapter_model__safetensors=_one_tensor("F32", [2, 2], [0, 8], b"\0" * 8)),
        "needs 16",
    ),
    BadPush(
        "unknown-dtype",
        _with(adapter_model__safetensors=_one_tensor("Q4", [2], [0, 2], b"\0" * 2)),
        "unsupported dtype",
    ),
    BadPush(
        "not-lora", _with(adapter_config__json=lora_config(peft_type="PREFIX_TUNING")), "only LORA"
    ),
    BadPush("rank-zero", _with(adapter_config__json=lora_config(r=0)), "integer >= 1"),
    BadPush("rank-float", _with(adapter_config__json=lora_config(r=4.0)), "integer >= 1"),
    BadPush("config-not-json", _with(adapter_config__json=b"{"), "not valid JSON"),
    BadPush(
        "target-regex",
        _with(adapter_config__json=lora_config(target_modules=".*proj")),
        "explicit list of module names",
    ),
    BadPush(
        "no-base-model",
        _with(adapter_config__json=lora_config(base_model_name_or_path=None)),
        "base_model_name_or_path",
    ),
    BadPush(
        "module-not-targeted",
        _with(adapter_config__json=lora_config(modules=("q_proj",))),
        "not in target_modules",
    ),
    BadPush("rank-mismatch", _with(adapter_config__json=lora_config(rank=8)), "must be [8, in]"),
    BadPush(
        "lora-b-shape",
        _with(adapter_model__safetensors=_weights_reshaped("lora_B", (16, 3))),
        "must be [out, 4]",
    ),
    BadPush(
        "not-a-lora-tensor",
        _with(adapter_model__safetensors=_weights_renamed("lora_A.weight", "weight")),
        "is not a LoRA weight",
    ),
    BadPush(
        "size-mismatch-short",
        tiny_adapter(),
        "received",
        header_files=_declared_with(CONFIG, size=len(tiny_adapter()[CONFIG]) + 10),
    ),
    BadPush(
        "size-mismatch-long",
        tiny_adapter(),
        "more than the declared",
        header_files=_declared_with(CONFIG, size=len(tiny_adapter()[CONFIG]) - 10),
    ),
    BadPush(
        "sha256-mismatch",
        tiny_adapter(),
        "does not match",
        header_files=_declared_with(CONFIG, sha256="0" * 64),
    ),
    BadPush(
        "file-over-limit",
        tiny_adapter(),
        "exceeds the limit",
        header_files=_declared_with(WEIGHTS, size=TEST_LIMITS.max_file_size + 1),
    ),
    BadPush(
        "chunk-undeclared",
        tiny_adapter(),
        "not declared",
        chunks=[Chunk("README.md", 0, b"hello")],
    ),
    BadPush(
        "chunk-out-of-order",
        tiny_adapter(),
        "header order",
        chunks=[Chunk(WEIGHTS, 0, tiny_adapter()[WEIGHTS])],
    ),
    BadPush(
        "chunk-bad-offset",
        tiny_adapter(),
        "expected offset 0",
        chunks=[Chunk(CONFIG, 5, tiny_adapter()[CONFIG])],
    ),
    BadPush(
        "config-nested-100k",
        _with(adapter_config__json=nested_json(100_000)),
        "adapter_config.json: JSON nested more than 64 levels deep",
    ),
    BadPush(
        "header-nested-50k",
        _with(adapter_model__safetensors=weights_with_nested_header(50_000)),
        "adapter_model.safetensors header: JSON nested more than 64 levels deep",
    ),
    BadPush(
        "nan-f32",
        _with(adapter_model__safetensors=_weights_holding(NAN, "F32")),
        f"tensor {_POISONED!r} holds NaN at element 13",
    ),
    BadPush(
        "inf-f16",
        _with(adapter_model__safetensors=_weights_holding(INF, "F16")),
        f"tensor {_POISONED!r} holds an infinity at element 13",
    ),
    BadPush(
        "minus-inf-bf16",
        _with(adapter_model__safetensors=_weights_holding(-INF, "BF16")),
        f"tensor {_POISONED!r} holds an infinity at element 13",
    ),
    BadPush(
        "nan-f64",
        _with(adapter_model__safetensors=_weights_holding(NAN, "F64")),
        f"tensor {_POISONED!r} holds NaN at element 13",
    ),
    BadPush(
        "unchecked-float-dtype",
        _with(adapter_model__safetensors=_one_tensor("F8_E4M3", [2], [0, 2], b"\x7f\x7f")),
        "dtype F8_E4M3, whose values cannot be checked for NaN and infinity",
    ),
    BadPush("nan-before-the-rest-is-sent", tiny_adapter(), "holds NaN", chunks=_nan_then_cut()),
    BadPush(
        "alpha-1e308",
        _with(adapter_config__json=lora_config(lora_alpha=1e308)),
        "lora_alpha = 1e+308 with r = 4 gives a LoRA scale (lora_alpha / r) of 2.5e+307",
    ),
    BadPush(
        "alpha-absurd",
        _with(adapter_config__json=lora_config(lora_alpha=4100)),
        "lora_alpha = 4100 with r = 4 gives a LoRA scale (lora_alpha / r) of 1025",
    ),
    BadPush(
        "alpha-absurd-rslora",
        _with(adapter_config__json=lora_config(lora_alpha=2050, use_rslora=True)),
        "scale (lora_alpha / sqrt(r)) of 1025",
    ),
    BadPush(
        "alpha-pattern-absurd",
        _with(adapter_config__json=lora_config(alpha_pattern={"v_proj": 1e300})),
        "alpha_pattern['v_proj'] = 1e+300",
    ),
]
