"""Adapter compatibility with the served model, and `--max-lora-rank auto`."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from loraserve.common.errors import FailedPrecondition, InvalidArgument
from loraserve.inference.adapters import (
    LLAMA_TARGET_MODULES,
    AdapterFacts,
    CompatibilityChecker,
    model_lora_shapes,
    model_lora_targets,
    smallest_covering_rank,
    supported_lora_ranks,
)
from loraserve.testing.adapters.models import TinyAdapterFactory

VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _checker(require_base_model_match: bool = True) -> CompatibilityChecker:
    return CompatibilityChecker(
        max_lora_rank=16,
        target_modules=LLAMA_TARGET_MODULES,
        served_model_name="/models/Llama-3-8B/",
        require_base_model_match=require_base_model_match,
    )


def _facts(**changes: object) -> AdapterFacts:
    fields: dict[str, object] = {
        "name": "alpha",
        "revision": 2,
        "rank": 8,
        "target_modules": ("q_proj", "v_proj"),
        "base_model": "meta-llama/Llama-3-8B",
    }
    fields.update(changes)
    return AdapterFacts(**fields)  # type: ignore[arg-type]


def test_matching_adapter_is_compatible() -> None:
    _checker().check(_facts())


def test_rank_above_the_engine_limit_is_refused_with_the_fix() -> None:
    with pytest.raises(FailedPrecondition, match=r"alpha@2 has LoRA rank 32.*--max-lora-rank"):
        _checker().check(_facts(rank=32))


def test_module_the_model_lacks_is_refused_naming_it() -> None:
    with pytest.raises(FailedPrecondition, match=r"\['c_attn'\]"):
        _checker().check(_facts(target_modules=("q_proj", "c_attn")))


def test_adapter_for_another_base_model_is_refused() -> None:
    with pytest.raises(FailedPrecondition, match="Mistral-7B"):
        _checker().check(_facts(base_model="mistralai/Mistral-7B"))


def test_base_model_check_can_be_relaxed() -> None:
    _checker(require_base_model_match=False).check(_facts(base_model="mistralai/Mistral-7B"))


def test_adapter_without_a_recorded_base_model_is_accepted() -> None:
    _checker().check(_facts(base_model=""))


def test_targets_are_read_from_the_model_weights(tiny_model_dir: Path) -> None:
    assert model_lora_targets(tiny_model_dir) == LLAMA_TARGET_MODULES


def test_vllm_supported_ranks_are_known() -> None:
    assert supported_lora_ranks() == VLLM_RANKS


@pytest.mark.parametrize(
    ("ranks", "expected"),
    [([4, 8], 8), ([8, 9], 16), ([300], 320), ([1], 1), ([], 16)],
)
def test_auto_rank_is_the_smallest_covering_supported_rank(ranks: list[int], expected: int) -> None:
    assert smallest_covering_rank(ranks, VLLM_RANKS) == expected


def test_auto_rank_beyond_vllm_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="1024"):
        smallest_covering_rank([1024], VLLM_RANKS)


def _shape_checker(tiny_model_dir: Path) -> CompatibilityChecker:
    return CompatibilityChecker(
        max_lora_rank=16,
        target_modules=LLAMA_TARGET_MODULES,
        served_model_name=str(tiny_model_dir),
        module_shapes=model_lora_shapes(tiny_model_dir),
    )


def test_adapter_with_shapes_of_the_model_passes_the_weights_check(
    tiny_model_dir: Path, tiny_adapter: TinyAdapterFactory
) -> None:
    _shape_checker(tiny_model_dir).check_weights("alpha", 1, tiny_adapter(seed=1))


def test_lora_tensor_narrower_than_its_layer_is_refused_naming_it(
    tiny_model_dir: Path, tiny_adapter: TinyAdapterFactory, tmp_path: Path
) -> None:
    source = tiny_adapter(seed=1)
    tensors = load_file(source / "adapter_model.safetensors")
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[name] = tensors[name][:, :64].contiguous()
    save_file(tensors, tmp_path / "adapter_model.safetensors")
    with pytest.raises(FailedPrecondition, match=r"q_proj\.lora_A\.weight has shape \[8, 64\]"):
        _shape_checker(tiny_model_dir).check_weights("alpha", 1, tmp_path)


def _copy_with(source: Path, target: Path, **config: object) -> Path:
    shutil.copytree(source, target)
    path = target / "adapter_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | config))
    return target


@pytest.mark.parametrize(("value", "kind"), [(math.nan, "NaN"), (-math.inf, "an infinity")])
def test_non_finite_weight_is_refused_naming_revision_and_tensor_without_model_shapes(
    tiny_adapter: TinyAdapterFactory, tmp_path: Path, value: float, kind: str
) -> None:
    adapter = _copy_with(tiny_adapter(seed=1), tmp_path / "a")
    tensors = load_file(adapter / "adapter_model.safetensors")
    name = "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"
    tensors[name][2, 3] = value
    save_file(tensors, adapter / "adapter_model.safetensors")
    with pytest.raises(FailedPrecondition) as caught:
        _checker().check_weights("alpha", 3, adapter)
    assert caught.value.message.startswith("adapter alpha@3: adapter_model.safetensors: ")
    assert f"tensor {name!r} holds {kind} at element 19 " in caught.value.message


def test_absurd_scale_is_refused_naming_the_config_field(
    tiny_model_dir: Path, tiny_adapter: TinyAdapterFactory, tmp_path: Path
) -> None:
    adapter = _copy_with(tiny_adapter(seed=1), tmp_path / "a", lora_alpha=1e308)
    with pytest.raises(FailedPrecondition, match=r"adapter alpha@3: adapter_config\.json: "):
        _shape_checker(tiny_model_dir).check_weights("alpha", 3, adapter)
