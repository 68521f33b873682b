"""The tiny model and adapter builders are deterministic, cached and safe to re-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors import safe_open

from loraserve.tiny.adapters import TinyAdapterSpec, build_tiny_adapter
from loraserve.tiny.builddir import MARKER, BuildConflictError, build_once
from loraserve.tiny.model import TinyModelSpec, build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", TinyModelSpec(seed=0))


def _writes(content: str) -> Callable[[Path], None]:
    def write(staging: Path) -> None:
        (staging / "w").write_text(content)

    return write


def _bytes(directory: Path, name: str) -> bytes:
    return (directory / name).read_bytes()


def test_same_seed_builds_identical_model_files(model_dir: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", TinyModelSpec(seed=0))
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert _bytes(again, name) == _bytes(model_dir, name), name


def test_different_seed_builds_different_model_weights(model_dir: Path, tmp_path: Path) -> None:
    other = build_tiny_model(tmp_path / "other", TinyModelSpec(seed=1))
    assert _bytes(other, "model.safetensors") != _bytes(model_dir, "model.safetensors")


def test_same_seed_builds_identical_adapter_files_across_processes(
    model_dir: Path, tmp_path: Path
) -> None:
    here = build_tiny_adapter(model_dir, tmp_path / "here", TinyAdapterSpec(rank=4, seed=7))
    # Another interpreter with another hash seed: set iteration order must not leak in.
    command = ["adapter", str(model_dir), str(tmp_path / "there"), "--rank", "4", "--seed", "7"]
    subprocess.run(
        [sys.executable, "-m", "loraserve.tiny", *command],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert _bytes(tmp_path / "there", name) == _bytes(here, name), name


def test_different_seed_builds_different_adapter_weights(model_dir: Path, tmp_path: Path) -> None:
    one = build_tiny_adapter(model_dir, tmp_path / "one", TinyAdapterSpec(rank=4, seed=1))
    two = build_tiny_adapter(model_dir, tmp_path / "two", TinyAdapterSpec(rank=4, seed=2))
    name = "adapter_model.safetensors"
    assert _bytes(one, name) != _bytes(two, name)


def test_adapter_has_the_requested_rank_and_modules_with_nonzero_weights(
    model_dir: Path, tmp_path: Path
) -> None:
    spec = TinyAdapterSpec(rank=4, seed=3, target_modules=("v_proj", "q_proj"))
    adapter = build_tiny_adapter(model_dir, tmp_path / "adapter", spec)

    config = json.loads((adapter / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    assert config["target_modules"] == ["q_proj", "v_proj"]
    with safe_open(str(adapter / "adapter_model.safetensors"), framework="pt") as tensors:
        names = sorted(tensors.keys())
        assert {name.split(".")[-3] for name in names} == {"q_proj", "v_proj"}
        for name in names:
            tensor = tensors.get_tensor(name)
            assert 4 in tensor.shape, name
            assert tensor.abs().sum() > 0, name


def test_building_an_existing_build_again_does_nothing(tmp_path: Path) -> None:
    writes: list[Path] = []

    def write(staging: Path) -> None:
        writes.append(staging)
        (staging / "weights").write_text("w")

    first = build_once(tmp_path / "out", {"seed": 1}, write)
    second = build_once(tmp_path / "out", {"seed": 1}, write)

    assert first == second
    assert len(writes) == 1


def test_building_leaves_no_staging_directory_behind(tmp_path: Path) -> None:
    build_once(tmp_path / "out", {"seed": 1}, _writes("w"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    assert (tmp_path / "out" / MARKER).is_file()


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    def write(staging: Path) -> None:
        (staging / "partial").write_text("p")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        build_once(tmp_path / "out", {"seed": 1}, write)
    assert list(tmp_path.iterdir()) == []


def test_building_over_a_different_build_is_refused(tmp_path: Path) -> None:
    build_once(tmp_path / "out", {"seed": 1}, _writes("1"))

    with pytest.raises(BuildConflictError, match="not built with these parameters"):
        build_once(tmp_path / "out", {"seed": 2}, _writes("2"))
    assert (tmp_path / "out" / "w").read_text() == "1"


def test_building_over_a_foreign_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")

    with pytest.raises(BuildConflictError):
        build_once(tmp_path / "out", {"seed": 1}, lambda staging: None)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
