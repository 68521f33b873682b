"""`pip install .` installs the servers and nothing else.

The wheel is built from what the images copy (their Dockerfiles' COPY lines); it must hold
the runtime packages only, none of which may import test support, the demo or the model
builders (`tests/support/` and `tools/` are separate, dev-only distributions). Importing the
servers' modules from the unpacked wheel, without the dev environment's path hooks, must not
load pytest, numpy or torch for the store, nor pytest or PEFT for inference.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_PACKAGES = {
    "adapterctl",
    "adapterstore",
    "clients",
    "common",
    "haproxyplacement",
    "inference",
}
# Never imported by code in the wheel, at module level or inside a function.
DEV_ONLY = (
    "pytest",
    "_pytest",
    "hypothesis",
    "moto",
    "trustme",
    "numpy",
    "peft",
    "transformers",
    "tokenizers",
    "loraserve.testing",
    "loraserve.tiny",
    "loraserve.demo",
    "loraserve.protogen",
    "loraserve.flagdoc",
)


def _dockerfile_sources() -> list[str]:
    dockerfile = (ROOT / "docker" / "adapterstore.Dockerfile").read_text()
    sources: list[str] = []
    for line in re.findall(r"^COPY\s+(.+)$", dockerfile, re.M):
        sources += shlex.split(line)[:-1]
    return sources


@pytest.fixture(scope="module")
def wheel_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip install .` would install, unpacked."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    source.mkdir()
    for name in _dockerfile_sources():
        path = ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy(path, source / name)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    built = subprocess.run(
        [*pip_wheel, "-q", "--disable-pip-version-check", "-w", str(tmp / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp / "dist").glob("loraserve-*.whl")
    unpacked = tmp / "root"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    return unpacked


def _modules(root: Path, package: str) -> list[str]:
    names = []
    for path in (root / "loraserve" / package).rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(names)


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _is_under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)


def test_the_wheel_holds_only_the_runtime_packages(wheel_root: Path) -> None:
    packages = {path.name for path in (wheel_root / "loraserve").iterdir()}
    assert packages == RUNTIME_PACKAGES
    assert not list(wheel_root.glob("loraserve/*.py")), "loraserve is a namespace package"
    test_files = [p.name for p in wheel_root.rglob("*.py") if p.name.startswith(("test", "conf"))]
    assert test_files == []


def test_no_module_in_the_wheel_imports_test_or_tool_code(wheel_root: Path) -> None:
    offenders = {
        str(path.relative_to(wheel_root)): sorted(
            name for name in _imported_names(path) if _is_under(name, DEV_ONLY)
        )
        for path in wheel_root.rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_nothing_shared_imports_a_service() -> None:
    """`loraserve.common` and the generated stubs import no service module: both services and
    every client import them."""
    shared = ROOT / "services" / "common" / "loraserve"
    services = ("loraserve.adapterctl", "loraserve.adapterstore", "loraserve.inference")
    stubs = ("loraserve.adapterstore.v1", "loraserve.inference.v1")
    offenders = {
        str(path.relative_to(shared)): sorted(
            name
            for name in _imported_names(path)
            if _is_under(name, services) and not _is_under(name, stubs)
        )
        for path in shared.rglob("*.py")
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def _loaded_after_importing(wheel_root: Path, modules: list[str]) -> list[str]:
    """The modules loaded by a fresh interpreter that imports `modules` from the wheel alone:
    site-packages is on the path for the dependencies, but no `.pth` hook of the dev
    environment (editable installs of this project, tools or test support) runs."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n"
        "    module = importlib.import_module(name)\n"
        f"    assert module.__file__.startswith({str(wheel_root)!r}), module.__file__\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    path = [str(wheel_root), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    done = subprocess.run(
        [sys.executable, "-S", "-c", script],
        env={"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    return loaded


def test_the_store_imports_no_test_or_model_building_library(wheel_root: Path) -> None:
    modules = _modules(wheel_root, "adapterstore") + _modules(wheel_root, "common")
    loaded = _loaded_after_importing(wheel_root, modules)
    heavy = (*DEV_ONLY, "torch", "vllm")
    assert [name for name in loaded if _is_under(name, heavy)] == []


def test_inference_imports_no_test_or_model_building_library(wheel_root: Path) -> None:
    modules = _modules(wheel_root, "inference")
    loaded = _loaded_after_importing(wheel_root, modules)
    # vLLM itself imports numpy and transformers; what matters is that nothing of ours does.
    dev_only = tuple(name for name in DEV_ONLY if name not in ("numpy", "transformers"))
    assert [name for name in loaded if _is_under(name, dev_only)] == []
