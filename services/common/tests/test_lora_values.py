"""The value checks of LoRA adapters: finite weights, found however the bytes are cut into
chunks, in bounded memory; a bounded scale."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from safetensors.numpy import save

from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.lora_values import (
    MAX_LORA_SCALE,
    WeightsFileCheck,
    check_config_scale,
    check_lora_scale,
)

A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
NUMPY_TYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64}


def _weights(dtype: str, value: float | None = None, at: tuple[int, int] = (5, 2)) -> bytes:
    rng = np.random.default_rng(0)
    b = rng.standard_normal((24, 3)).astype(NUMPY_TYPES[dtype])
    if value is not None:
        b[at] = value
    return save({A: rng.standard_normal((3, 24)).astype(NUMPY_TYPES[dtype]), B: b})


def _check_in_pieces(data: bytes, size: int) -> None:
    check = WeightsFileCheck(len(data))
    for offset in range(0, len(data), size):
        check.update(data[offset : offset + size])
    check.finish()


@pytest.mark.parametrize("dtype", sorted(NUMPY_TYPES))
@pytest.mark.parametrize("piece", [1, 3, 7, 1000, 10**6])
def test_finite_weights_pass_in_pieces_of_any_size(dtype: str, piece: int) -> None:
    _check_in_pieces(_weights(dtype), piece)


@pytest.mark.parametrize("dtype", sorted(NUMPY_TYPES))
@pytest.mark.parametrize(("value", "kind"), [(math.nan, "NaN"), (math.inf, "an infinity")])
@pytest.mark.parametrize("piece", [1, 3, 7, 1000])
def test_non_finite_value_is_named_with_tensor_and_element_wherever_chunks_split_it(
    dtype: str, value: float, kind: str, piece: int
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        _check_in_pieces(_weights(dtype, value), piece)
    assert caught.value.message == (
        f"adapter_model.safetensors: tensor {B!r} holds {kind} at element 17 (shape [24, 3]); "
        "LoRA weights must be finite"
    )


@pytest.mark.parametrize(
    ("bits", "kind"), [(0x7FC0, "NaN"), (0xFF80, "an infinity"), (0x7F80, "an infinity")]
)
def test_bfloat16_non_finite_values_are_found(bits: int, kind: str) -> None:
    values = np.zeros(8, "<u2")
    values[6] = bits
    header = f'{{"{A}":{{"dtype":"BF16","shape":[2,4],"data_offsets":[0,16]}}}}'.encode()
    data = len(header).to_bytes(8, "little") + header + values.tobytes()
    with pytest.raises(InvalidArgument, match=rf"holds {kind} at element 6 \(shape \[2, 4\]\)"):
        _check_in_pieces(data, 5)


def test_largest_finite_bfloat16_passes() -> None:
    values = np.array([0x7F7F, 0xFF7F, 0x0001, 0x8000], "<u2")  # +-max, tiny, -0
    header = f'{{"{A}":{{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}}}'.encode()
    _check_in_pieces(len(header).to_bytes(8, "little") + header + values.tobytes(), 3)


def test_a_float_dtype_the_check_cannot_read_is_refused_by_name() -> None:
    header = f'{{"{A}":{{"dtype":"F8_E5M2","shape":[2],"data_offsets":[0,2]}}}}'.encode()
    data = len(header).to_bytes(8, "little") + header + b"\x7c\x7c"
    with pytest.raises(InvalidArgument, match=r"dtype F8_E5M2, whose values cannot be checked"):
        _check_in_pieces(data, 100)


def test_file_that_ends_early_is_refused() -> None:
    data = _weights("F32")
    check = WeightsFileCheck(len(data))
    check.update(data[:-4])
    with pytest.raises(InvalidArgument, match="data section ends after"):
        check.finish()


def test_memory_held_is_one_chunk_not_the_file() -> None:
    chunk = 1 << 20
    rng = np.random.default_rng(1)
    weights = save({A: rng.standard_normal((64, 64 * 1024), np.float32)})  # 16 MiB
    tracemalloc.start()
    try:
        check = WeightsFileCheck(len(weights))
        view = memoryview(weights)
        for offset in range(0, len(weights), chunk):
            check.update(view[offset : offset + chunk])
        check.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * chunk, peak


def _config(**fields: object) -> dict[str, object]:
    return {"r": 8, "lora_alpha": 16} | fields


@pytest.mark.parametrize(
    "config",
    [
        _config(),
        _config(lora_alpha=8 * MAX_LORA_SCALE),
        _config(lora_alpha=-8 * MAX_LORA_SCALE),
        _config(lora_alpha=0),
        _config(r=64, lora_alpha=8 * MAX_LORA_SCALE, use_rslora=True),
        _config(alpha_pattern={"q_proj": 32}),
    ],
    ids=["common", "at-bound", "negative-at-bound", "zero", "rslora-at-bound", "alpha-pattern"],
)
def test_scales_within_the_bound_pass(config: dict[str, object]) -> None:
    check_lora_scale(config)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_config(lora_alpha=1e308), "lora_alpha = 1e+308 with r = 8 gives a LoRA scale"),
        (_config(lora_alpha=10**400), "of inf; it must be finite"),
        (_config(lora_alpha=8 * MAX_LORA_SCALE + 8), "of 1025; it must be finite and at most"),
        (_config(r=16, lora_alpha=4100, use_rslora=True), "(lora_alpha / sqrt(r)) of 1025"),
        (_config(alpha_pattern={"v_proj": 1e9}), "alpha_pattern['v_proj'] = 1000000000.0"),
        (_config(alpha_pattern={"v_proj": "big"}), "alpha_pattern['v_proj'] must be a number"),
    ],
    ids=["alpha-1e308", "alpha-beyond-float", "over-bound", "rslora", "pattern", "not-number"],
)
def test_absurd_scale_is_refused_naming_the_field(config: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_lora_scale(config)
    assert message in caught.value.message
    assert caught.value.message.startswith("adapter_config.json: ")


def test_config_bytes_without_a_valid_rank_are_left_to_the_full_check() -> None:
    check_config_scale(b'{"r": "eight", "lora_alpha": 1e308}')
    check_config_scale(b"not json")
    with pytest.raises(InvalidArgument, match="lora_alpha = 1e"):
        check_config_scale(b'{"r": 8, "lora_alpha": 1e308}')


def test_cost_of_bytes_that_complete_a_known_header_includes_the_header() -> None:
    data = save({A: np.zeros((4, 16), dtype=np.float32)})
    header_end = 8 + int.from_bytes(data[:8], "little")
    check = WeightsFileCheck(len(data))
    check.update(data[:8])
    assert (check.cost(1), check.cost(header_end - 8)) == (1, header_end - 8 + header_end)
    check.update(data[8:header_end])
    assert check.cost(16) == 16
