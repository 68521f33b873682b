"""Modules stay small enough to read in one sitting: no runtime module in `services/`
over 400 lines and no function over 60 (generated stubs aside), and no test module over
400 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _runtime_modules() -> Iterator[Path]:
    for path in sorted(SERVICES.rglob("*.py")):
        parts = path.relative_to(SERVICES).parts
        if "tests" in parts or "v1" in parts:
            continue
        yield path


MODULES = list(_runtime_modules())


def _name(path: Path) -> str:
    return str(path.relative_to(SERVICES))


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_has_at_most_400_lines(path: Path) -> None:
    lines = len(path.read_text("utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_name(path)} has {lines} lines"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_functions_have_at_most_60_lines(path: Path) -> None:
    long = [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, line {node.lineno})"
        for node in ast.walk(ast.parse(path.read_text("utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, f"{_name(path)}: {', '.join(long)}"


def test_the_size_checks_see_every_service() -> None:
    roots = {path.relative_to(SERVICES).parts[0] for path in MODULES}
    assert roots == {"adapterctl", "adapterstore", "common", "inference"}


TEST_MODULES = sorted(
    path
    for folder in ("services", "tests", "tools", "bench")
    for path in (ROOT / folder).rglob("test_*.py")
    if ".venv" not in path.parts
)


@pytest.mark.parametrize("path", TEST_MODULES, ids=lambda path: str(path.relative_to(ROOT)))
def test_test_module_has_at_most_400_lines(path: Path) -> None:
    lines = len(path.read_text("utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path.relative_to(ROOT)} has {lines} lines"
