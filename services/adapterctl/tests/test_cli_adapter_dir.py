"""Reading adapter directories: file selection, completeness, hashing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from loraserve.adapterctl.adapter_dir import check_complete, hash_files, list_adapter_dir
from loraserve.common.errors import InvalidArgument
from loraserve.testing.adapters.badpushes import nested_json, weights_with_nested_header
from loraserve.testing.adapters.ctl import write_adapter_dir

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


def test_required_files_come_first_and_others_are_ignored(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / "training_args.bin").write_bytes(b"pickle")
    (tmp_path / "optimizer.pt").write_bytes(b"pickle")
    listing = list_adapter_dir(tmp_path)
    assert [p.name for p in listing.selected] == [CONFIG, WEIGHTS, "README.md"]
    assert sorted(listing.ignored) == ["optimizer.pt", "training_args.bin"]


def test_hidden_files_are_skipped_without_a_warning(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    (tmp_path / ".loraserve-tiny.json").write_text("{}")
    (tmp_path / ".adapter_config.json.swp").write_bytes(b"x")
    listing = list_adapter_dir(tmp_path)
    assert listing.ignored == ()
    assert all(not p.name.startswith(".") for p in listing.selected)


def test_symlinked_files_are_followed(tmp_path: Path) -> None:
    blobs = write_adapter_dir(tmp_path / "blobs")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    for name in (CONFIG, WEIGHTS):
        (snapshot / name).symlink_to(blobs / name)
    assert [p.name for p in list_adapter_dir(snapshot).selected] == [CONFIG, WEIGHTS]


def test_hashes_match_the_file_contents(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    files = hash_files(list_adapter_dir(tmp_path))
    for local in files.files:
        data = (tmp_path / local.name).read_bytes()
        assert local.sha256 == hashlib.sha256(data).hexdigest()
        assert local.size == len(data)


def test_complete_directory_passes(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    check_complete(list_adapter_dir(tmp_path))


@pytest.mark.parametrize("keep", [4, 20, 200, -1])
def test_truncated_safetensors_is_incomplete(tmp_path: Path, keep: int) -> None:
    write_adapter_dir(tmp_path)
    weights = tmp_path / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:keep])
    with pytest.raises(InvalidArgument, match=WEIGHTS):
        check_complete(list_adapter_dir(tmp_path))


def test_half_written_config_is_incomplete(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    config = tmp_path / CONFIG
    config.write_bytes(config.read_bytes()[:10])
    with pytest.raises(InvalidArgument, match=CONFIG):
        check_complete(list_adapter_dir(tmp_path))


def test_deeply_nested_config_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    (tmp_path / CONFIG).write_bytes(nested_json(100_000))
    with pytest.raises(InvalidArgument, match=f"{CONFIG}: JSON nested more than 64 levels"):
        check_complete(list_adapter_dir(tmp_path))


def test_deeply_nested_safetensors_header_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    (tmp_path / WEIGHTS).write_bytes(weights_with_nested_header(50_000))
    with pytest.raises(InvalidArgument, match=f"{WEIGHTS} header: JSON nested more than 64"):
        check_complete(list_adapter_dir(tmp_path))


def test_identical_content_has_the_same_fingerprint(tmp_path: Path) -> None:
    first = hash_files(list_adapter_dir(write_adapter_dir(tmp_path / "a", seed=1)))
    same = hash_files(list_adapter_dir(write_adapter_dir(tmp_path / "b", seed=1)))
    other = hash_files(list_adapter_dir(write_adapter_dir(tmp_path / "c", seed=2)))
    assert first.fingerprint() == same.fingerprint()
    assert first.fingerprint() != other.fingerprint()
