"""Reading PEFT adapter files: JSON nested too deep is refused naming the file, before
anything recursive (the JSON parser, the inference service's shape check) runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.peft_format import check_json_depth, load_json_object, matrix_shapes
from loraserve.testing.adapters.badpushes import nested_json, weights_with_nested_header


def test_matrix_shapes_refuses_a_deeply_nested_header_naming_the_file(tmp_path: Path) -> None:
    weights = tmp_path / "adapter_model.safetensors"
    weights.write_bytes(weights_with_nested_header(50_000))
    with pytest.raises(InvalidArgument, match=r"adapter_model\.safetensors safetensors header"):
        matrix_shapes(weights)


def test_json_object_nested_100k_deep_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match=r"adapter_config\.json: JSON nested more than 64"):
        load_json_object(nested_json(100_000), "adapter_config.json")


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = b'{"a": "' + b"[{" * 100 + b'\\"]", "b": [[1], {"c": [2]}]}'
    check_json_depth(text, "f.json")
    assert load_json_object(text, "f.json")["b"] == [[1], {"c": [2]}]


def test_nesting_up_to_the_bound_is_accepted() -> None:
    assert load_json_object(nested_json(63), "f.json")["x"] is not None
