"""The previous release (`[tool.loraserve.compat] previous-release`) installed beside this
checkout, so a test can run its store and its replica next to today's.

Its code comes from `git archive` of the ref, built into a wheel and installed without
dependencies into a virtual environment of its own, made from the same base
interpreter. That environment shares everything else (vLLM, torch, grpc) with the
running one through a `.pth` file holding one plain path, the running environment's
site-packages: a path line does not process the `.pth` files of the directory it
adds, so the editable installs of this checkout's `loraserve` stay out, and the
release's own `loraserve` comes first on `sys.path`.

A missing ref, or a checkout without git history, is a failure with its reason: the
upgrade it stands for would otherwise go untested without anyone noticing.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import sysconfig
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from loraserve.protocompat.gitref import RefUnreadable
from loraserve.protocompat.gitref import previous_release as previous_release_ref

log = logging.getLogger(__name__)

# The packages whose every portion must come from the release's install.
_CHECKED_PACKAGES = (
    "loraserve",
    "loraserve.adapterstore",
    "loraserve.inference",
    "loraserve.common",
    "loraserve.clients",
)
# Where each package's portions, and the distribution's metadata, are read from.
_WHERE_FROM = """
import importlib, importlib.metadata, json, sys
paths = {name: list(importlib.import_module(name).__path__) for name in sys.argv[1:]}
paths["metadata"] = [str(importlib.metadata.distribution("loraserve").locate_file("x").parent)]
print(json.dumps(paths))
"""


class ReleaseUnavailable(Exception):
    """The previous release cannot be installed from this checkout."""


@dataclass(frozen=True)
class Release:
    """An installed previous release."""

    ref: str
    commit: str
    # The release's source tree, as `git archive` wrote it.
    tree: Path
    # Runs the interpreter of its environment: `python -m loraserve.adapterstore` runs
    # the release's store.
    python: Path
    build_seconds: float


def previous_release(root: Path, workdir: Path) -> Release:
    """Installs the previous release of the checkout at `root` under `workdir` (empty)."""
    started = time.monotonic()
    try:
        ref = previous_release_ref(root)
    except RefUnreadable as e:
        raise ReleaseUnavailable(str(e)) from e
    commit = _resolve(root, ref)
    tree, env, wheels = workdir / "tree", workdir / "env", workdir / "wheels"
    _export(root, commit, tree)
    _run(sys.executable, "-m", "venv", "--without-pip", str(env))
    python = env / "bin" / "python"
    _run(
        *_pip(),
        "wheel",
        "--no-index",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(wheels),
        str(tree),
    )
    # Installed before the .pth below exists: pip then sees no other `loraserve` to
    # replace, least of all this checkout's.
    _run(
        *_pip(),
        "--python",
        str(python),
        "install",
        "--no-index",
        "--no-deps",
        *map(str, wheels.glob("*.whl")),
    )
    site = Path(_run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"))
    (site / "loraserve-shared-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    launcher = _launcher(python)
    _check_imports(launcher, site)
    release = Release(ref, commit, tree, launcher, time.monotonic() - started)
    log.info(
        "release.installed ref=%s commit=%s python=%s build_s=%.1f",
        ref,
        commit,
        python,
        release.build_seconds,
    )
    return release


def _resolve(root: Path, ref: str) -> str:
    """The commit `ref` names, or why this checkout has none."""
    commit = _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if commit.returncode == 0:
        return commit.stdout.decode().strip()
    shallow = _git(root, "rev-parse", "--is-shallow-repository")
    if shallow.returncode != 0:
        raise ReleaseUnavailable(f"{root} is not a git checkout: {shallow.stderr.decode().strip()}")
    if shallow.stdout.decode().strip() == "true":
        raise ReleaseUnavailable(
            f"the previous release {ref} is not in this shallow clone: git fetch --unshallow"
        )
    raise ReleaseUnavailable(
        f"the previous release {ref} is not in this clone: fetch it (git fetch --tags "
        "origin), or fix [tool.loraserve.compat] previous-release in pyproject.toml"
    )


def _export(root: Path, commit: str, tree: Path) -> None:
    with subprocess.Popen(
        ["git", "-C", str(root), "archive", "--format=tar", commit],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as archive:
        assert archive.stdout is not None
        with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
            tar.extractall(tree, filter="data")
        errors = archive.stderr.read().decode() if archive.stderr else ""
    if archive.returncode != 0:
        raise ReleaseUnavailable(f"git archive {commit} failed: {errors.strip()}")


def _launcher(python: Path) -> Path:
    """The environment's interpreter run with -P: the working directory stays off
    `sys.path`, so a checkout there (its `loraserve.egg-info`, say) cannot stand in for
    the release's own metadata: its version, its entry points."""
    launcher = python.with_name("release-python")
    launcher.write_text(f'#!/bin/sh\nexec "{python}" -P "$@"\n')
    launcher.chmod(0o755)
    return launcher


def _check_imports(python: Path, site: Path) -> None:
    """Every `loraserve` package the release's processes import, and the metadata they
    read, comes from `site`."""
    paths = json.loads(_run(str(python), "-c", _WHERE_FROM, *_CHECKED_PACKAGES))
    strays = {
        name: [p for p in portions if not Path(p).is_relative_to(site)]
        for name, portions in paths.items()
    }
    strays = {name: portions for name, portions in strays.items() if portions}
    if strays:
        raise ReleaseUnavailable(
            f"the previous release's environment imports code from elsewhere: {strays}"
        )


def _pip() -> tuple[str, ...]:
    return (sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)
    except OSError as e:
        raise ReleaseUnavailable(f"cannot run git: {e}") from e


def _run(*command: str) -> str:
    """The command's stdout, stripped; its output in the failure when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReleaseUnavailable(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
        )
    return done.stdout.strip()
