"""The correctness oracle: greedy tokens from Hugging Face transformers + PEFT in fp32.

Greedy decoding of the same weights must give the same tokens in vLLM and here, so
tests compare what the served engine streams with what this module computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def greedy_tokens(
    model_dir: Path,
    adapter_dir: Path | None,
    prompt_token_ids: Sequence[int],
    max_new_tokens: int,
) -> list[int]:
    """The `max_new_tokens` token ids greedy decoding appends to the prompt.

    With `adapter_dir` None this is the base model. EOS does not stop generation, as
    with vLLM's `ignore_eos=True`, so the result always has `max_new_tokens` ids.
    """
    if not prompt_token_ids:
        raise ValueError("the prompt needs at least one token id")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # generate() falls back to the model's generation config for an unset EOS; clearing
    # it there is what stops generation from ending early.
    base.generation_config.eos_token_id = None
    # Any: transformers' and PEFT's annotations of generate() do not agree with each other.
    model: Any = base if adapter_dir is None else PeftModel.from_pretrained(base, str(adapter_dir))
    model.eval()

    input_ids = torch.tensor([list(prompt_token_ids)], dtype=torch.long)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
        )
    generated: list[int] = output[0, input_ids.shape[1] :].tolist()
    return generated
