"""The previous release's `proto/`, read from git without checking anything out."""

from __future__ import annotations

import io
import subprocess
import tarfile
import tomllib
from pathlib import Path


class RefUnreadable(Exception):
    """The previous release's contracts cannot be read from this checkout."""


def previous_release(root: Path) -> str:
    """`[tool.loraserve.compat] previous-release` from the project's pyproject.toml."""
    pyproject = root / "pyproject.toml"
    try:
        with pyproject.open("rb") as file:
            ref = tomllib.load(file)["tool"]["loraserve"]["compat"]["previous-release"]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise RefUnreadable(
            f"{pyproject}: no [tool.loraserve.compat] previous-release ({exc!r})"
        ) from exc
    if not isinstance(ref, str) or not ref:
        raise RefUnreadable(f"{pyproject}: previous-release is not a git ref: {ref!r}")
    return ref


def export_protos(root: Path, ref: str, dest: Path) -> str:
    """Writes `proto/` as it is at `ref` under `dest`; returns the commit `ref` names."""
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if commit.returncode != 0:
        raise RefUnreadable(_missing(root, ref))
    sha = commit.stdout.decode().strip()
    archive = _git(root, "archive", "--format=tar", sha, "proto")
    if archive.returncode != 0:
        raise RefUnreadable(f"git archive {ref} proto: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return sha


def _missing(root: Path, ref: str) -> str:
    """Why `ref` does not resolve, and what to do about it."""
    shallow = _git(root, "rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        return f"{root} is not a git checkout: {shallow.stderr.decode().strip()}"
    if shallow.stdout.decode().strip() == "true":
        return (
            f"{ref} is not in this shallow clone's history: "
            "fetch the history: git fetch --unshallow"
        )
    return (
        f"{ref} is not in this clone: fetch it (git fetch --tags origin), "
        "or fix [tool.loraserve.compat] previous-release in pyproject.toml"
    )


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)
    except OSError as exc:
        raise RefUnreadable(f"cannot run git: {exc}") from exc
