"""Adapters with new weights for every push, so that no push is deduplicated.

A variant keeps a built adapter's config and tensor shapes and draws every LoRA entry
afresh (same spread as loraserve.tiny's adapters: visible in greedy output), in
milliseconds and without torch.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

# loraserve.tiny.adapters' spread of every LoRA entry.
LORA_WEIGHT_STD = 0.15
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def write_variant(source: Path, out: Path, seed: int) -> Path:
    """Writes an adapter like `source` with weights drawn from `seed` into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / CONFIG, out / CONFIG)
    rng = np.random.default_rng(seed)
    tensors = {
        name: (rng.standard_normal(t.shape) * LORA_WEIGHT_STD).astype(t.dtype)
        for name, t in sorted(load_file(str(source / WEIGHTS)).items())
    }
    save_file(tensors, str(out / WEIGHTS))
    return out
