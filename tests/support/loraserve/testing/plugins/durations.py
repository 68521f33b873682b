"""The slowest test modules of a run, printed at its end so every CI log says where the
suite's time went.

A module's time is the sum of its tests' setup, call and teardown, module and session
fixtures included where they were set up (pytest puts a fixture's cost in the setup of
the first test that asked for it). Under pytest-xdist every report reaches the
controller, which sums and prints them; `--dist loadfile` keeps a module on one worker,
so its time is that worker's.
"""

from __future__ import annotations

import pytest

# How many modules the summary names.
SLOWEST = 20


def slowest(seconds: dict[str, float], count: int = SLOWEST) -> list[tuple[str, float]]:
    """The `count` modules with the most seconds, slowest first (ties by name)."""
    return sorted(seconds.items(), key=lambda item: (-item[1], item[0]))[:count]


class ModuleSeconds:
    """Sums each module's reported seconds and prints the slowest at the end."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] = self.seconds.get(module, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.seconds:
            return
        terminalreporter.section(f"the {SLOWEST} slowest modules (setup, calls and teardown)")
        for module, spent in slowest(self.seconds):
            terminalreporter.write_line(f"{spent:8.1f} s  {module}")
        terminalreporter.write_line(f"{sum(self.seconds.values()):8.1f} s  every module, summed")


def pytest_configure(config: pytest.Config) -> None:
    # On the controller only (or a run without workers): it sees every worker's reports.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModuleSeconds(), "loraserve-module-seconds")
