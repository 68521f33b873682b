"""The CPU build's fixes: tokens without an adapter (index -1) get no LoRA delta and meet no
slot's weights; a non-finite key or value never stays in the KV cache for the next owner."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from vllm import _custom_ops as ops
from vllm.lora.ops.torch_ops import lora_ops

from loraserve.inference.engine.cpu_kv_fix import (
    attend_one_token,
    attends_past_sequence_end,
    one_block,
    probe_isa,
    writing_finite,
)
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


def _poisoned_slots(value: float) -> torch.Tensor:
    """Slot 1 is a real adapter; every other slot holds `value`."""
    weights = torch.full((3, 1, 2, 4), value)
    weights[1] = 1.0
    return weights


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 3e38])
def test_fixed_shrink_keeps_base_tokens_away_from_every_slot(value: float) -> None:
    shrink = skipping_no_lora(getattr(lora_ops.bgmv_shrink, "__wrapped__", lora_ops.bgmv_shrink))
    output = torch.full((3, 2), 7.0)
    shrink(torch.ones(3, 4), _poisoned_slots(value), output, torch.tensor([-1, 1, -1]), 1.0)
    assert output.tolist() == [[0.0, 0.0], [4.0, 4.0], [0.0, 0.0]]


@pytest.mark.parametrize("op_name", ["bgmv_expand", "bgmv_expand_slice"])
@pytest.mark.parametrize("value", [math.nan, math.inf, 3e38])
def test_fixed_expand_adds_nothing_from_a_poisoned_slot_to_base_tokens(
    op_name: str, value: float
) -> None:
    op = getattr(lora_ops, op_name)
    expand = skipping_no_lora(getattr(op, "__wrapped__", op))
    weights = torch.full((2, 1, 4, 2), value)
    weights[1] = 1.0
    output = torch.ones(3, 4)
    slice_args = (0, 4) if op_name == "bgmv_expand_slice" else ()
    expand(torch.full((3, 2), 3.0), weights, output, torch.tensor([-1, 1, -1]), *slice_args, True)
    assert output.tolist() == [[1.0] * 4, [7.0] * 4, [1.0] * 4]


def _unpatched_write() -> Callable[..., Any]:
    write: Callable[..., Any] = getattr(
        ops.cpu_attn_reshape_and_cache, "__wrapped__", ops.cpu_attn_reshape_and_cache
    )
    return write


def test_unpatched_attention_multiplies_positions_past_the_sequence_end() -> None:
    assert attends_past_sequence_end(_unpatched_write(), probe_isa())


@pytest.mark.parametrize("stale", [math.nan, math.inf, -math.inf])
def test_value_a_previous_owner_left_in_a_block_does_not_reach_the_next(stale: float) -> None:
    write, isa = writing_finite(_unpatched_write()), probe_isa()
    key_cache, value_cache = one_block(0.0)
    # The previous owner of the block wrote two tokens; the second is not finite.
    previous = torch.stack((torch.ones(1, 64), torch.full((1, 64), stale)))
    write(previous, previous, key_cache, value_cache, torch.tensor([0, 1]), isa)
    # The next owner has one token, at position 0, so position 1 is past its end.
    token = torch.ones(1, 1, 64)
    write(token, 2 * token, key_cache, value_cache, torch.tensor([0]), isa)
    assert attend_one_token(key_cache, value_cache, isa).tolist() == [2.0] * 64


def test_finite_keys_and_values_are_written_unchanged() -> None:
    write, isa = writing_finite(_unpatched_write()), probe_isa()
    key_cache, value_cache = one_block(0.0)
    value = torch.tensor([[[3e38, -3e38, 1e-45, 0.5] * 16]])
    write(torch.ones(1, 1, 64), value, key_cache, value_cache, torch.tensor([0]), isa)
    assert torch.equal(attend_one_token(key_cache, value_cache, isa), value[0, 0])
