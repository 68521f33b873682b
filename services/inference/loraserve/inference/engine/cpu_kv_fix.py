"""Part of the CPU build's vLLM fixes: its KV cache never holds a NaN or an infinity.

vLLM's CPU attention kernel (`cpu_attention_with_kv_cache`) works on whole KV blocks:
for the positions of a block past a sequence's end it sets the scores to -inf, so
their probability is 0, and still multiplies those positions' value rows into the
output. The rows hold whatever the block's previous owner wrote, and 0 x NaN and
0 x inf are NaN. So once one request wrote a non-finite key or value (an adapter with
NaN weights, or weights large enough to overflow), every later request that is given
one of its freed blocks answers garbage: with any adapter, or none.

`register` probes the installed kernel (a block full of NaN, one token written and
attended) and only if its output is not finite wraps `cpu_attn_reshape_and_cache`,
the one write into the cache, so that NaN is written as 0 and an infinity as the
dtype's largest finite value. For finite values nothing changes; a request whose own
keys or values are not finite answers garbage either way, and nobody else sees them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_PATCHED = "_loraserve_writes_finite"
# The probe's shape: the smallest the CPU kernels take for float32 (head_dim a
# multiple of 32, a block of 32 positions).
_HEAD_DIM = 64
_BLOCK_SIZE = 32


def writing_finite(op: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps `cpu_attn_reshape_and_cache(key, value, ...)` so the cache gets finite
    keys and values: NaN as 0, infinities as the largest finite value of the dtype."""

    @functools.wraps(op)
    def fixed(key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        return op(torch.nan_to_num(key, nan=0.0), torch.nan_to_num(value, nan=0.0), *args, **kwargs)

    setattr(fixed, _PATCHED, True)
    return fixed


def one_block(fill: float) -> tuple[Any, Any]:
    """The key and value caches of one float32 KV block of one head, every value `fill`."""
    import torch

    cache = torch.full((1, 1, _BLOCK_SIZE, 2 * _HEAD_DIM), fill, dtype=torch.float32)
    key_cache, value_cache = cache.view(1, 1, 2 * _BLOCK_SIZE, _HEAD_DIM).chunk(2, dim=2)
    return key_cache, value_cache


def attend_one_token(key_cache: Any, value_cache: Any, isa: str) -> Any:
    """The attention output of a one-token sequence at position 0 of `one_block`'s
    block, its query all ones."""
    import torch
    from vllm import _custom_ops as ops

    seq_lens = torch.tensor([1], dtype=torch.int32)
    query_start_loc = torch.tensor([0, 1], dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        1, 1, 1, _HEAD_DIM, seq_lens, torch.float32, query_start_loc, True, -1, isa, False
    )
    output = torch.zeros(1, 1, _HEAD_DIM)
    ops.cpu_attention_with_kv_cache(
        query=torch.ones(1, 1, _HEAD_DIM),
        key_cache=key_cache,
        value_cache=value_cache,
        output=output,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        scale=1.0,
        causal=True,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=torch.tensor([[0]], dtype=torch.int32),
        softcap=0.0,
        scheduler_metadata=metadata,
        s_aux=None,
    )
    return output[0, 0]


def attends_past_sequence_end(reshape_and_cache: Callable[..., Any], isa: str) -> bool:
    """Whether a one-token sequence in a block whose other positions hold NaN gets a
    non-finite attention output: the kernel multiplies positions past the end."""
    import torch

    key_cache, value_cache = one_block(float("nan"))
    token = torch.ones(1, 1, _HEAD_DIM)
    reshape_and_cache(token, token, key_cache, value_cache, torch.tensor([0]), isa)
    return not bool(torch.isfinite(attend_one_token(key_cache, value_cache, isa)).all())


def probe_isa() -> str:
    """The ISA the CPU kernels use for the probe's block (private to vLLM: a vLLM that
    moved it makes `register` skip the patch, with a warning)."""
    import torch
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    return str(_get_attn_isa(torch.float32, _BLOCK_SIZE, _HEAD_DIM))


def register() -> None:
    """Probes the CPU build's attention and patches its cache writes if needed."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm import _custom_ops as ops

    if getattr(ops.cpu_attn_reshape_and_cache, _PATCHED, False):
        return
    try:
        leaks = attends_past_sequence_end(ops.cpu_attn_reshape_and_cache, probe_isa())
    except Exception:
        # A vLLM whose CPU attention API moved: nothing is patched blind.
        log.warning("vllm_fixes.kv_probe_failed: the KV cache is not sanitised", exc_info=True)
        return
    if not leaks:
        return
    ops.cpu_attn_reshape_and_cache = writing_finite(ops.cpu_attn_reshape_and_cache)
    log.info("vllm_fixes.patched ops=cpu_attn_reshape_and_cache reason=stale-kv-non-finite")
