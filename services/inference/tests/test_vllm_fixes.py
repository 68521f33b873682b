"""The CPU LoRA ops fix: tokens without an adapter (index -1) get no LoRA delta."""

from __future__ import annotations

import torch
from vllm.lora.ops.torch_ops import lora_ops

from loraserve.inference.engine.cpu_lora_fix import (
    applies_last_slot_to_base_tokens,
    skipping_no_lora,
)


def _slots() -> torch.Tensor:
    weights = torch.zeros(3, 1, 2, 4)
    weights[1] = 1.0
    weights[2] = 2.0
    return weights


def test_unpatched_op_gives_base_tokens_the_last_slot() -> None:
    original = getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink)
    assert applies_last_slot_to_base_tokens(original)


def test_fixed_shrink_gives_base_tokens_no_delta() -> None:
    shrink = skipping_no_lora(getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink))
    output = torch.full((3, 2), 7.0)
    shrink(torch.ones(3, 4), _slots(), output, torch.tensor([1, -1, 2]), 1.0)
    assert output.tolist() == [[4.0, 4.0], [0.0, 0.0], [8.0, 8.0]]


def test_fixed_expand_adds_nothing_to_base_tokens() -> None:
    expand = skipping_no_lora(getattr(lora_ops.bgmv_expand, "__wrapped__", lora_ops.bgmv_expand))
    weights = torch.ones(2, 1, 4, 2)
    output = torch.ones(2, 4)
    expand(torch.ones(2, 2), weights, output, torch.tensor([-1, 1]), True)
    assert output.tolist() == [[1.0] * 4, [3.0] * 4]


def test_fixed_op_is_unchanged_for_real_slots() -> None:
    original = getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink)
    inputs, indices = torch.randn(4, 4), torch.tensor([0, 1, 2, 1])
    expected, actual = torch.zeros(4, 2), torch.zeros(4, 2)
    original(inputs, _slots(), expected, indices, 0.5)
    skipping_no_lora(original)(inputs, _slots(), actual, indices, 0.5)
    assert torch.equal(actual, expected)
