"""A vLLM plugin that fixes base-model requests batched with LoRA requests on the CPU build.

vLLM marks tokens of requests without an adapter with LoRA index -1. The Triton
kernels of the GPU build skip them; the plain-PyTorch ops of the CPU build gather
`weights[-1]` instead, i.e. the adapter in the *last* LoRA slot, and add its delta to
base-model tokens. Once every slot is in use, base-model answers silently change
(upstream: vllm-project/vllm pull request 48421, open as of vLLM 0.32).

vLLM loads `vllm.general_plugins` entry points in every one of its processes, the
engine core included, which is where these ops run. `register` probes the installed
ops and patches them only if they still apply slot -1, so a vLLM release with the fix
is left alone.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_PATCHED = "_loraserve_skips_no_lora"


def skipping_no_lora(op: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a `bgmv_*` op so tokens with LoRA index -1 get no LoRA delta: their input
    rows are zeroed (so the delta is exactly zero) and the index clamped to a real slot."""

    @functools.wraps(op)
    def fixed(
        inputs: Any, weights: Any, output: Any, indices: Any, *args: Any, **kwargs: Any
    ) -> Any:
        no_lora = indices < 0
        if inputs.shape[0] == indices.shape[0] and bool(no_lora.any()):
            inputs = inputs.masked_fill(no_lora.view(-1, 1), 0)
            indices = indices.clamp(min=0)
        return op(inputs, weights, output, indices, *args, **kwargs)

    setattr(fixed, _PATCHED, True)
    return fixed


def applies_last_slot_to_base_tokens(bgmv_shrink: Callable[..., Any]) -> bool:
    """Whether `bgmv_shrink` gives a token with LoRA index -1 the last slot's delta."""
    import torch

    weights = torch.zeros(2, 1, 1, 1)
    weights[1] = 1.0
    output = torch.zeros(1, 1)
    bgmv_shrink(torch.ones(1, 1), weights, output, torch.tensor([-1]), 1.0)
    return bool(output.abs().sum() > 0)


def register() -> None:
    """Entry point of the `vllm.general_plugins` group."""
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
