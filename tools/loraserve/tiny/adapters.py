"""PEFT LoRA adapters with random weights for a locally built model.

The weights are random but not zero (PEFT's default zero-initialised B would make an
adapter a no-op), and large enough that an adapter visibly changes greedy output.
The same model, spec and seed always give the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from loraserve.tiny.builddir import Params, build_once

LLAMA_PROJECTIONS = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)

# Standard deviation of every LoRA A and B entry. The update B @ A * alpha / rank then
# has entries of about 2 * 0.15**2 * sqrt(rank) ~ 0.13 at rank 8, beside base weights
# of 0.1: the adapter changes the output without drowning the base model.
_LORA_WEIGHT_STD = 0.15


@dataclass(frozen=True)
class TinyAdapterSpec:
    """What to build; every field changes the bytes of the result."""

    rank: int = 8
    seed: int = 0
    # None means 2 * rank, the common choice.
    alpha: int | None = None
    target_modules: tuple[str, ...] = LLAMA_PROJECTIONS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"LoRA rank must be at least 1, got {self.rank}")
        if not self.target_modules:
            raise ValueError("an adapter needs at least one target module")
        unknown = sorted(set(self.target_modules) - set(LLAMA_PROJECTIONS))
        if unknown:
            raise ValueError(
                f"unknown target modules {unknown}; a Llama model has {list(LLAMA_PROJECTIONS)}"
            )
        # One spelling per set of modules, so that equal adapters have equal specs.
        object.__setattr__(self, "target_modules", tuple(sorted(set(self.target_modules))))

    @property
    def lora_alpha(self) -> int:
        return self.alpha if self.alpha is not None else 2 * self.rank


def build_tiny_adapter(model_dir: Path, out_dir: Path, spec: TinyAdapterSpec | None = None) -> Path:
    """Build a LoRA adapter for the model in `model_dir` into `out_dir` (a no-op if built)."""
    spec = spec or TinyAdapterSpec()
    model_dir = model_dir.absolute()
    params: Params = {
        "kind": "adapter",
        "base_model": str(model_dir),
        "rank": spec.rank,
        "alpha": spec.lora_alpha,
        "seed": spec.seed,
        "target_modules": list(spec.target_modules),
    }
    return build_once(out_dir, params, lambda staging: _write_adapter(model_dir, staging, spec))


def _write_adapter(model_dir: Path, out_dir: Path, spec: TinyAdapterSpec) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.lora_alpha,
        target_modules=list(spec.target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        init_lora_weights=False,
    )
    model = get_peft_model(base, config)
    # Fill from a generator of our own, in name order, so the bytes depend on the seed
    # alone and not on PEFT's initialisation order or the global random state.
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if ".lora_A." in name or ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * _LORA_WEIGHT_STD)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    _sort_target_modules(out_dir / "adapter_config.json")


def _sort_target_modules(config_path: Path) -> None:
    # PEFT stores target_modules from a set, in hash order, which differs between runs.
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["target_modules"] = sorted(config["target_modules"])
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
