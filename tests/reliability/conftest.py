"""The reliability suite prints the figures its tests recorded (see loraserve.testing.figures)."""

from __future__ import annotations

import pytest

from loraserve.testing.figures import figures


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    recorded = figures(config)
    if not recorded:
        return
    terminalreporter.section("reliability figures")
    for name, value in recorded.items():
        terminalreporter.write_line(f"{name}: {value}")
