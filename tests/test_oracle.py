"""vLLM serves LoRA adapters exactly: its greedy tokens equal transformers + PEFT's.

Four adapters of different ranks and the base model run in one concurrent batch,
so the check covers vLLM's mixed-adapter batching, not one adapter at a time. Four
adapters fill every LoRA slot of the test engine, the last one included: that is
when the CPU build, unpatched, gives base-model tokens the last slot's delta
(see `loraserve.inference.engine.cpu_lora_fix`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loraserve.testing.engine import MAX_LORAS
from loraserve.testing.models import TinyAdapterFactory
from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

# Token ids, so that tokenization cannot be the reason two implementations disagree.
PROMPTS = (
    (1, 42, 71, 293, 81, 326, 276, 275),
    (1, 300, 17, 88, 412, 5, 260, 99, 140, 33, 201),
)
MAX_NEW_TOKENS = 24
# Far above the ids other tests and the inference service hand out: vLLM caches
# adapters by id, and this engine is shared by the whole session.
FIRST_LORA_ID = 9_000_001


@dataclass(frozen=True)
class Variant:
    """The base model (no adapter) or one adapter, as both implementations see it."""

    name: str
    adapter_dir: Path | None
    lora_int_id: int | None


@pytest.fixture(scope="module")
def variants(tiny_adapter: TinyAdapterFactory) -> list[Variant]:
    adapters = [("rank4", 4, 101), ("rank8", 8, 102), ("rank16", 16, 103), ("rank8b", 8, 104)]
    assert len(adapters) == MAX_LORAS, "the batch must fill every LoRA slot"
    return [Variant("base", None, None)] + [
        Variant(name, tiny_adapter(rank=rank, seed=seed), FIRST_LORA_ID + index)
        for index, (name, rank, seed) in enumerate(adapters)
    ]


@pytest.fixture(scope="module")
async def expected(
    tiny_model_dir: Path, variants: list[Variant]
) -> dict[tuple[str, int], list[int]]:
    """Greedy tokens from transformers + PEFT, by (variant name, prompt index)."""
    return {
        (variant.name, index): await asyncio.to_thread(
            greedy_tokens, tiny_model_dir, variant.adapter_dir, prompt, MAX_NEW_TOKENS
        )
        for variant in variants
        for index, prompt in enumerate(PROMPTS)
    }


@pytest.fixture(scope="module")
async def served(
    vllm_engine: AsyncLLM, variants: list[Variant]
) -> dict[tuple[str, int], list[int]]:
    """Greedy tokens from the vLLM engine, every request submitted at once."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0,
        max_tokens=MAX_NEW_TOKENS,
        ignore_eos=True,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )

    async def run(variant: Variant, index: int) -> list[int]:
        lora = None
        if variant.adapter_dir is not None and variant.lora_int_id is not None:
            lora = LoRARequest(variant.name, variant.lora_int_id, str(variant.adapter_dir))
        final: list[int] = []
        async for output in vllm_engine.generate(
            TokensPrompt(prompt_token_ids=list(PROMPTS[index])),
            params,
            request_id=f"oracle-{variant.name}-{index}",
            lora_request=lora,
        ):
            final = list(output.outputs[0].token_ids)
        return final

    keys = [(variant, index) for variant in variants for index in range(len(PROMPTS))]
    try:
        results = await asyncio.gather(*(run(variant, index) for variant, index in keys))
    finally:
        for variant in variants:
            if variant.lora_int_id is not None:
                await vllm_engine.remove_lora(variant.lora_int_id)
    return {
        (variant.name, index): tokens
        for (variant, index), tokens in zip(keys, results, strict=True)
    }


def test_served_greedy_tokens_equal_transformers_peft_in_a_mixed_batch(
    served: dict[tuple[str, int], list[int]], expected: dict[tuple[str, int], list[int]]
) -> None:
    assert served == expected


def test_each_adapter_changes_the_served_tokens(
    served: dict[tuple[str, int], list[int]],
) -> None:
    for index in range(len(PROMPTS)):
        outputs = [tokens for (_, prompt), tokens in sorted(served.items()) if prompt == index]
        assert len({tuple(tokens) for tokens in outputs}) == len(outputs), outputs
