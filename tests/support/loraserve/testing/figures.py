"""Figures a test run reports at its end: faults injected, inputs tried, streams run.

Tests add to a counter with `add_figure`; the reliability suite's conftest prints
every figure in the terminal summary, so CI logs carry them.
"""

from __future__ import annotations

import pytest

FIGURES = pytest.StashKey[dict[str, int]]()


def add_figure(config: pytest.Config, name: str, amount: int = 1) -> None:
    figures = config.stash.setdefault(FIGURES, {})
    figures[name] = figures.get(name, 0) + amount


def figures(config: pytest.Config) -> dict[str, int]:
    return dict(sorted(config.stash.get(FIGURES, {}).items()))
