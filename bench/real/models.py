"""The `--profile real` model and adapters, built locally by the project's tiny builders
(loraserve.tiny; nothing downloaded) and cached under .cache/bench/real/: a Llama-shaped
base of TinyLlama-1.1B's widths with 8 layers (hidden 2048, intermediate 5632, 32 heads
of 64, 4 KV heads, vocab 32,000: about 480 M parameters, 1.9 GB in fp32) and rank-64
PEFT adapters on all seven projections (about 73 MB each in fp32). Two adapters are
built with PEFT; the others are variants of them (bench.rig.variants: the same shapes and
config, new weights), which takes seconds instead of loading the base each time."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.rig.stack import CACHE
from bench.rig.variants import write_variant
from loraserve.tiny.adapters import TinyAdapterSpec, build_tiny_adapter
from loraserve.tiny.model import TinyModelSpec, build_tiny_model

REAL = CACHE / "real"
MODEL_SPEC = TinyModelSpec(
    vocab_size=32_000,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=8,
    num_attention_heads=32,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    # The usual initialisation: the base is for timing, not for greedy oracles.
    initializer_range=0.02,
)
RANK = 64
BUILT = 2


def model_dir() -> Path:
    return REAL / "model-h2048-l8-v32k"


def adapter_dir(i: int) -> Path:
    return REAL / f"r{RANK}-{i:02d}"


def build_model() -> Path:
    return build_tiny_model(model_dir(), MODEL_SPEC)


def build_adapters(count: int) -> dict[str, Path]:
    """`count` adapters named r00.. (the first BUILT with PEFT, the rest variants)."""
    base = build_model()
    built: dict[str, Path] = {}
    for i in range(count):
        if i < BUILT:
            path = build_tiny_adapter(base, adapter_dir(i), TinyAdapterSpec(rank=RANK, seed=i))
        else:
            path = adapter_dir(i)
            if not path.exists():  # written aside, then renamed: never half there
                staging = path.with_name(path.name + ".partial")
                shutil.rmtree(staging, ignore_errors=True)
                write_variant(built["r00"], staging, seed=1000 + i)
                staging.rename(path)
        built[f"r{i:02d}"] = path
    return built


def describe() -> str:
    s = MODEL_SPEC
    return (
        f"Llama-shaped base built locally: hidden {s.hidden_size}, intermediate "
        f"{s.intermediate_size}, {s.num_hidden_layers} layers, {s.num_attention_heads} heads "
        f"/ {s.num_key_value_heads} KV heads, vocab {s.vocab_size:,}, random weights; PEFT "
        f"adapters rank {RANK} on all 7 projections (fp32 files)"
    )
