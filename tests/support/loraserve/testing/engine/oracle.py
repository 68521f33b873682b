"""Comparing the session's vLLM engine with the transformers + PEFT oracle: the same
greedy tokens, for the base model and each adapter, on prompts given as token ids (so
tokenization cannot be why two implementations disagree)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

# Two prompts of different lengths, as token ids of the tiny model's vocabulary.
PROMPTS: tuple[tuple[int, ...], ...] = (
    (1, 42, 71, 293, 81, 326, 276, 275),
    (1, 300, 17, 88, 412, 5, 260, 99, 140, 33, 201),
)
# (variant name, prompt index) -> the greedy tokens generated
Tokens = dict[tuple[str, int], list[int]]


@dataclass(frozen=True)
class Variant:
    """The base model (no adapter) or one adapter, as both implementations see it."""

    name: str
    adapter_dir: Path | None
    lora_int_id: int | None


async def oracle_tokens(
    model_dir: Path, variants: Sequence[Variant], prompts: Sequence[Sequence[int]], n: int
) -> Tokens:
    """The `n` greedy tokens transformers + PEFT generate, for every variant and prompt."""
    return {
        (variant.name, index): await asyncio.to_thread(
            greedy_tokens, model_dir, variant.adapter_dir, prompt, n
        )
        for variant in variants
        for index, prompt in enumerate(prompts)
    }


async def served_tokens(
    engine: AsyncLLM,
    variants: Sequence[Variant],
    prompts: Sequence[Sequence[int]],
    n: int,
    label: str,
) -> Tokens:
    """The `n` greedy tokens (EOS ignored) the engine generates for every variant and
    prompt, all submitted at once so that they run in the same batches. Request ids
    start with `label`, which must be unique among concurrent calls."""
    keys = [(variant, index) for variant in variants for index in range(len(prompts))]
    results = await asyncio.gather(
        *(
            _greedy(engine, variant, prompts[index], n, f"{label}-{variant.name}-{index}")
            for variant, index in keys
        )
    )
    return {
        (variant.name, index): tokens
        for (variant, index), tokens in zip(keys, results, strict=True)
    }


async def _greedy(
    engine: AsyncLLM, variant: Variant, prompt: Sequence[int], n: int, request_id: str
) -> list[int]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(
        temperature=0.0, max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY
    )
    lora = None
    if variant.adapter_dir is not None and variant.lora_int_id is not None:
        lora = LoRARequest(variant.name, variant.lora_int_id, str(variant.adapter_dir))
    final: list[int] = []
    async for output in engine.generate(
        TokensPrompt(prompt_token_ids=list(prompt)),
        params,
        request_id=request_id,
        lora_request=lora,
    ):
        final = list(output.outputs[0].token_ids)
    return final


async def remove_adapters(engine: AsyncLLM, variants: Sequence[Variant]) -> None:
    """Takes every variant's adapter out of the engine (the engine is the session's)."""
    for variant in variants:
        if variant.lora_int_id is not None:
            await engine.remove_lora(variant.lora_int_id)
