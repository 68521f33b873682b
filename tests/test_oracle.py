"""vLLM serves LoRA adapters exactly: its greedy tokens equal transformers + PEFT's.

Four adapters of different ranks and the base model run in one concurrent batch,
so the check covers vLLM's mixed-adapter batching, not one adapter at a time. Four
adapters fill every LoRA slot of the test engine, the last one included: that is
when the CPU build, unpatched, gives base-model tokens the last slot's delta
(see `loraserve.inference.engine.cpu_lora_fix`).
"""

from __future__ import annotations

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
from loraserve.testing.engine.session import MAX_LORAS

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

MAX_NEW_TOKENS = 24
# Far above the ids other tests and the inference service hand out: vLLM caches
# adapters by id, and this engine is shared by the whole session.
FIRST_LORA_ID = 9_000_001


@pytest.fixture(scope="module")
def variants(tiny_adapter: TinyAdapterFactory) -> list[Variant]:
    adapters = [("rank4", 4, 101), ("rank8", 8, 102), ("rank16", 16, 103), ("rank8b", 8, 104)]
    assert len(adapters) == MAX_LORAS, "the batch must fill every LoRA slot"
    return [Variant("base", None, None)] + [
        Variant(name, tiny_adapter(rank=rank, seed=seed), FIRST_LORA_ID + index)
        for index, (name, rank, seed) in enumerate(adapters)
    ]


@pytest.fixture(scope="module")
async def expected(tiny_model_dir: Path, variants: list[Variant]) -> Tokens:
    """Greedy tokens from transformers + PEFT, by (variant name, prompt index)."""
    return await oracle_tokens(tiny_model_dir, variants, PROMPTS, MAX_NEW_TOKENS)


@pytest.fixture(scope="module")
async def served(vllm_engine: AsyncLLM, variants: list[Variant]) -> Tokens:
    """Greedy tokens from the vLLM engine, every request submitted at once."""
    try:
        return await served_tokens(vllm_engine, variants, PROMPTS, MAX_NEW_TOKENS, "oracle")
    finally:
        await remove_adapters(vllm_engine, variants)


def test_served_greedy_tokens_equal_transformers_peft_in_a_mixed_batch(
    served: Tokens, expected: Tokens
) -> None:
    assert served == expected


def test_each_adapter_changes_the_served_tokens(served: Tokens) -> None:
    for index in range(len(PROMPTS)):
        outputs = [tokens for (_, prompt), tokens in sorted(served.items()) if prompt == index]
        assert len({tuple(tokens) for tokens in outputs}) == len(outputs), outputs
