"""No adapter's weights change a request that does not use it, on the engine path itself.

An adapter whose weights are NaN, infinite, or finite but large enough to overflow is
loaded straight into the vLLM engine (the store's and the replica's checks are not on
this path: the point is what the engine does once such an adapter got in). It runs
first alone, so it takes a LoRA slot and leaves its non-finite keys and values in KV
blocks that go back to the pool, then in the same batches as the base model and two
other adapters, then those again without it while it stays in its slot. Every token
of the others must equal transformers + PEFT's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.oracle import (
    PROMPTS,
    Tokens,
    Variant,
    oracle_tokens,
    remove_adapters,
    served_tokens,
)

if TYPE_CHECKING:
    import torch
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

MAX_NEW_TOKENS = 16
# Far from the ids other tests and the inference service use (see test_oracle.py).
FIRST_LORA_ID = 9_100_001
WEIGHTS = "adapter_model.safetensors"


def _all_nan(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.fill_(float("nan"))


def _all_inf(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.fill_(float("inf"))


def _huge(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.fill_(3e38)  # finite in float32; x @ A overflows


# How each poisoned adapter is made from a valid one: which weights, what value.
POISONS: dict[str, tuple[str, Callable[[torch.Tensor], torch.Tensor]]] = {
    "nan-lora-b": (".lora_B.", _all_nan),
    "inf-lora-a": (".lora_A.", _all_inf),
    "huge-finite-lora-a": (".lora_A.", _huge),
}


def _poisoned(source: Path, target: Path, kind: str) -> Path:
    from safetensors.torch import load_file, save_file

    part, change = POISONS[kind]
    shutil.copytree(source, target)
    tensors = load_file(str(target / WEIGHTS))
    for name, tensor in tensors.items():
        if part in name:
            change(tensor)
    save_file(tensors, str(target / WEIGHTS), metadata={"format": "pt"})
    return target


@pytest.fixture(scope="module")
def tenants(tiny_adapter: TinyAdapterFactory) -> list[Variant]:
    """The base model and two adapters that share the engine with the poisoned one."""
    return [
        Variant("base", None, None),
        Variant("acme-support", tiny_adapter(rank=8, seed=301), FIRST_LORA_ID),
        Variant("acme-legal", tiny_adapter(rank=16, seed=302), FIRST_LORA_ID + 1),
    ]


@pytest.fixture(scope="module")
async def expected(tiny_model_dir: Path, tenants: list[Variant]) -> Tokens:
    """Greedy tokens from transformers + PEFT, by (tenant name, prompt index)."""
    return await oracle_tokens(tiny_model_dir, tenants, PROMPTS, MAX_NEW_TOKENS)


@pytest.mark.parametrize("kind", list(POISONS))
async def test_a_poisoned_adapter_in_a_slot_changes_no_other_request(
    kind: str,
    vllm_engine: AsyncLLM,
    tenants: list[Variant],
    expected: Tokens,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
) -> None:
    poison_dir = _poisoned(tiny_adapter(rank=8, seed=303), tmp_path / kind, kind)
    poison = Variant("poison", poison_dir, FIRST_LORA_ID + 2 + list(POISONS).index(kind))
    label = f"isolation-{kind}"
    try:
        # Alone first: it takes a LoRA slot, and its KV blocks go back to the pool.
        await served_tokens(vllm_engine, [poison], PROMPTS, MAX_NEW_TOKENS, f"{label}-alone")
        beside = await served_tokens(
            vllm_engine, [*tenants, poison], PROMPTS, MAX_NEW_TOKENS, f"{label}-beside"
        )
        after = await served_tokens(vllm_engine, tenants, PROMPTS, MAX_NEW_TOKENS, f"{label}-after")
    finally:
        await remove_adapters(vllm_engine, [*tenants, poison])
    assert {key: beside[key] for key in expected} == expected
    assert after == expected
