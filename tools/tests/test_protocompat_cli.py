"""`python -m loraserve.protocompat` on a real git history: the previous release's contracts
read from git, its exit status, and what it says when the ref cannot be read."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from loraserve.protocompat.__main__ import main

PROTO = "proto/demo/v1/demo.proto"
CONTRACT = 'syntax = "proto3";\npackage demo.v1;\nmessage Kept {}\nmessage Dropped {}\n'


def _git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    done = subprocess.run(
        ["git", "-C", str(repo), *identity, *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _commit(repo: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "--quiet", "-m", "change")
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A project whose previous release is its only commit."""
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "--quiet")
    release = _commit(root, {PROTO: CONTRACT})
    compat = f'[tool.loraserve.compat]\nprevious-release = "{release}"\n'
    (root / "pyproject.toml").write_text(compat)
    return root


def test_an_unchanged_contract_passes_and_says_what_it_compared(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--root", str(repo)]) == 0
    assert "compared 1 files, 2 messages, 0 enums, 0 services, 0 rpcs" in capsys.readouterr().out


def test_a_break_in_the_working_tree_fails_with_its_line(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / PROTO).write_text(CONTRACT.replace("message Dropped {}\n", ""))
    assert main(["--root", str(repo)]) == 1
    line = "proto/demo/v1/demo.proto:demo.v1.Dropped: MESSAGE_NO_DELETE: message deleted"
    assert line in capsys.readouterr().out.splitlines()


def test_the_contract_is_read_at_the_ref_not_from_the_checkout(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = _git(repo, "rev-parse", "HEAD")
    _commit(repo, {PROTO: CONTRACT.replace("message Dropped {}\n", "")})
    assert main(["--root", str(repo), "--against", release]) == 1
    assert "demo.v1.Dropped: MESSAGE_NO_DELETE" in capsys.readouterr().out


def test_an_unknown_ref_cannot_be_compared(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(repo), "--against", "v9.9.9"]) == 2
    assert "v9.9.9 is not in this clone" in capsys.readouterr().err


def test_a_shallow_clone_is_told_to_fetch_the_history(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _commit(repo, {"pyproject.toml": (repo / "pyproject.toml").read_text()})
    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "--quiet", "--depth", "1", f"file://{repo}", str(clone))
    assert main(["--root", str(clone)]) == 2
    assert "fetch the history: git fetch --unshallow" in capsys.readouterr().err
