"""Tiny adapter files for tests: a valid PEFT LoRA adapter and hand-written safetensors.

The adapters are written with safetensors' own numpy writer, so the store's
validator is checked against what the real library produces.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
from safetensors.numpy import save

BASE_MODEL = "tiny-llama"

AdapterFiles = dict[str, bytes]


def lora_config(
    rank: int = 4, modules: tuple[str, ...] = ("q_proj", "v_proj"), **extra: Any
) -> bytes:
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(modules),
        "base_model_name_or_path": BASE_MODEL,
    }
    config.update(extra)
    return json.dumps(config).encode()


def lora_tensors(
    rank: int = 4,
    modules: tuple[str, ...] = ("q_proj", "v_proj"),
    layers: int = 2,
    hidden: int = 16,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for module in modules:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = rng.standard_normal((rank, hidden), np.float32)
            tensors[f"{prefix}.lora_B.weight"] = rng.standard_normal((hidden, rank), np.float32)
    return tensors


def tiny_adapter(rank: int = 4, seed: int = 0, **extra_files: bytes) -> AdapterFiles:
    """A valid PEFT LoRA adapter's files, small enough for unit tests."""
    files = {
        "adapter_config.json": lora_config(rank),
        "adapter_model.safetensors": save(lora_tensors(rank, seed=seed)),
    }
    files.update(extra_files)
    return files


def raw_safetensors(header: dict[str, Any], data: bytes, length: int | None = None) -> bytes:
    """A safetensors file written by hand, so tests can break any part of it."""
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data
