"""A vLLM plugin that keeps tokens without an adapter away from every LoRA slot on the CPU build.

vLLM marks tokens of requests without an adapter with LoRA index -1. The Triton
kernels of the GPU build skip them; the plain-PyTorch ops of the CPU build gather
`weights[-1]` instead, i.e. the adapter in the *last* LoRA slot, and add its delta to
base-model tokens. Once every slot is in use, base-model answers silently change
(upstream: vllm-project/vllm pull request 48421, open as of vLLM 0.32).

Zeroing those tokens' inputs and pointing them at a real slot is not enough: a slot
holding a NaN or an infinity turns 0 x weight into NaN, and every base-model request
batched with it answers garbage. So the fixed ops never multiply a -1 token by any
slot's weights: the op runs on the other tokens' rows alone, and the -1 tokens' rows
get what the op gives for a slot of zeros (`_zero_slot`), with zero inputs.

vLLM loads `vllm.general_plugins` entry points in every one of its processes, the
engine core included, which is where these ops run. `register` probes the installed
ops and patches them only if they still apply slot -1, so a vLLM release with the fix
is left alone; it also runs the CPU build's other tenant-isolation fix,
`cpu_kv_fix` (a non-finite value left in a freed KV block reaches the next owner).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from loraserve.inference.engine import cpu_kv_fix

log = logging.getLogger(__name__)

_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_PATCHED = "_loraserve_skips_no_lora"


def skipping_no_lora(op: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a `bgmv_*` op so tokens with LoRA index -1 get the delta of a slot of zeros
    (none), whatever the slots hold: no slot's weights meet a row that does not use it."""

    @functools.wraps(op)
    def fixed(
        inputs: Any, weights: Any, output: Any, indices: Any, *args: Any, **kwargs: Any
    ) -> Any:
        no_lora = indices < 0
        if not bool(no_lora.any()):
            return op(inputs, weights, output, indices, *args, **kwargs)
        import torch

        zero = _zero_slot(weights)
        if not inputs.shape[0] == output.shape[0] == indices.shape[0]:
            # Rows are not one per token: a copy of the slots with a zero slot at the end.
            zero_index = torch.full_like(indices, weights.shape[0])
            return op(
                inputs,
                torch.cat((weights, zero)),
                output,
                torch.where(no_lora, zero_index, indices),
                *args,
                **kwargs,
            )
        lora_rows = torch.nonzero(~no_lora).squeeze(1)
        if lora_rows.numel():
            row_inputs, row_indices = inputs.index_select(0, lora_rows), indices[lora_rows]
            _on_rows(op, lora_rows, row_inputs, weights, output, row_indices, *args, **kwargs)
        base_rows = torch.nonzero(no_lora).squeeze(1)
        base_inputs = inputs.new_zeros((base_rows.shape[0], *inputs.shape[1:]))
        at_zero = indices.new_zeros(base_rows.shape)
        _on_rows(op, base_rows, base_inputs, zero, output, at_zero, *args, **kwargs)
        return None

    setattr(fixed, _PATCHED, True)
    return fixed


def _on_rows(
    op: Callable[..., Any],
    rows: Any,
    inputs: Any,
    weights: Any,
    output: Any,
    indices: Any,
    *args: Any,
    **kwargs: Any,
) -> None:
    """`op` for `rows` of the batch alone (`inputs` and `indices` are already those
    rows'); it writes into a copy of their output rows, copied back after."""
    part = output.index_select(0, rows)
    op(inputs, weights, part, indices, *args, **kwargs)
    output.index_copy_(0, rows, part)


# One slot of zeros per weight shape, dtype and device: made once, never written.
_ZERO_SLOTS: dict[tuple[Any, ...], Any] = {}


def _zero_slot(weights: Any) -> Any:
    key = (tuple(weights.shape[1:]), weights.dtype, weights.device)
    zero = _ZERO_SLOTS.get(key)
    if zero is None:
        zero = _ZERO_SLOTS[key] = weights.new_zeros((1, *weights.shape[1:]))
    return zero


def applies_last_slot_to_base_tokens(bgmv_shrink: Callable[..., Any]) -> bool:
    """Whether `bgmv_shrink` gives a token with LoRA index -1 the last slot's delta."""
    import torch

    weights = torch.zeros(2, 1, 1, 1)
    weights[1] = 1.0
    output = torch.zeros(1, 1)
    bgmv_shrink(torch.ones(1, 1), weights, output, torch.tensor([-1]), 1.0)
    return bool(output.abs().sum() > 0)


def register() -> None:
    """Entry point of the `vllm.general_plugins` group: the CPU build's fixes."""
    _patch_lora_ops()
    cpu_kv_fix.register()


def _patch_lora_ops() -> None:
    from vllm.lora.ops import torch_ops
    from vllm.lora.ops.torch_ops import lora_ops

    if getattr(lora_ops.bgmv_shrink, _PATCHED, False):
        return
    if not applies_last_slot_to_base_tokens(lora_ops.bgmv_shrink):
        return
    from vllm.lora.punica_wrapper import punica_cpu

    for name in _OPS:
        fixed = skipping_no_lora(getattr(lora_ops, name))
        # The sgmv_* ops call these through lora_ops' globals; punica_cpu and the
        # package imported the names themselves.
        for module in (lora_ops, torch_ops, punica_cpu):
            if hasattr(module, name):
                setattr(module, name, fixed)
    log.info("vllm_fixes.patched ops=%s reason=cpu-lora-index-minus-one", ",".join(_OPS))
