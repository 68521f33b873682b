"""The inference service's subpackages import only what docs/architecture.md's map allows,
and from one another only through each subpackage's public surface (`__all__`)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "services/inference/loraserve/inference"
PREFIX = "loraserve.inference."

# Who may import whom, lowest layer first. The top-level modules `app` and `__main__`
# assemble the service and may import everything; `v1` is the generated contract.
ALLOWED: dict[str, frozenset[str]] = {
    "settings": frozenset(),
    "v1": frozenset(),
    "engine": frozenset({"settings"}),
    "cache": frozenset(),
    "adapters": frozenset({"engine", "cache"}),
    "sync": frozenset({"adapters", "cache"}),
    "metrics": frozenset({"engine", "adapters"}),
    "serving": frozenset({"engine", "adapters", "metrics", "v1"}),
    "openai": frozenset({"engine", "adapters", "metrics", "serving", "settings"}),
    "transport": frozenset({"engine", "serving", "settings", "v1"}),
}
ASSEMBLERS = frozenset({"app", "__main__"})


def _part_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of the inference package in a file, lazy
    and TYPE_CHECKING ones included."""
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            yield node.lineno, node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PREFIX):
                    yield node.lineno, alias.name, []


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_pb2" not in p.name)


def _public_surface(part: str) -> set[str]:
    tree = ast.parse((PACKAGE / part / "__init__.py").read_text("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{part}/__init__.py names no __all__")


def test_every_part_of_the_package_is_on_the_map() -> None:
    parts = {_part_of(path) for path in _modules()} - ASSEMBLERS - {"__init__"}
    assert parts == set(ALLOWED)


def test_subpackages_import_only_what_the_map_allows() -> None:
    wrong = []
    for path in _modules():
        part = _part_of(path)
        if part in ASSEMBLERS or part == "__init__":
            continue
        for line, module, _ in _imports(path):
            used = module.removeprefix(PREFIX).split(".")[0]
            if used != part and used not in ALLOWED[part]:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert wrong == []


SUBPACKAGES = sorted(p for p in ALLOWED if (PACKAGE / p).is_dir() and p != "v1")


@pytest.mark.parametrize("part", SUBPACKAGES)
def test_other_parts_import_a_subpackage_only_through_its_public_surface(part: str) -> None:
    surface = _public_surface(part)
    wrong = []
    for path in _modules():
        if _part_of(path) == part:
            continue
        for line, module, names in _imports(path):
            dotted = module.removeprefix(PREFIX).split(".")
            if dotted[0] != part:
                continue
            if len(dotted) > 1 or not set(names) <= surface:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {module} {names}")
    assert wrong == []
