"""Figures a test run reports at its end: faults injected, inputs tried, streams run.

Tests add to a counter with `add_figure`; this plugin prints every figure in the
terminal summary, so CI logs carry them. When the suite runs on several workers
(pytest-xdist), each worker hands its figures to the controller, which sums them.
"""

from __future__ import annotations

from typing import Any

import pytest

FIGURES = pytest.StashKey[dict[str, int]]()
_WORKER_OUTPUT_KEY = "loraserve_figures"


def add_figure(config: pytest.Config, name: str, amount: int = 1) -> None:
    figures = config.stash.setdefault(FIGURES, {})
    figures[name] = figures.get(name, 0) + amount


def figures(config: pytest.Config) -> dict[str, int]:
    return dict(sorted(config.stash.get(FIGURES, {}).items()))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Set only on an xdist worker: what it sends back to the controller.
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_WORKER_OUTPUT_KEY] = figures(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    sent = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT_KEY, {})
    for name, value in sent.items():
        add_figure(node.config, name, value)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    recorded = figures(config)
    if not recorded:
        return
    terminalreporter.section("reliability figures")
    for name, value in recorded.items():
        terminalreporter.write_line(f"{name}: {value}")
