"""The slowest test modules of a run, printed at its end so every CI log says where the
suite's time went.

A module's time is the sum of its tests' setup, call and teardown, module and session
fixtures included where they were set up (pytest puts a fixture's cost in the setup of
the first test that asked for it). Under pytest-xdist every report reaches the
controller, which sums and prints them; `--dist loadfile` keeps a module on one worker,
so its time is that worker's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# How many modules the summary names.
SLOWEST = 20


def slowest(seconds: dict[str, float], count: int = SLOWEST) -> list[tuple[str, float]]:
    """The `count` modules with the most seconds, slowest first (ties by name)."""
    return sorted(seconds.items(), key=lambda item: (-item[1], item[0]))[:count]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-module-durations",
        metavar="PATH",
        help="write every module's seconds to PATH (JSON, slowest first) at the end",
    )


class ModuleSeconds:
    """Sums each module's reported seconds, prints the slowest at the end and, when
    asked, writes them all."""

    def __init__(self, record: Path | None) -> None:
        self.seconds: dict[str, float] = {}
        self._record = record

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
        if self._record is not None:
            every = slowest(self.seconds, len(self.seconds))
            self._record.write_text(json.dumps({m: round(s, 1) for m, s in every}, indent=1) + "\n")
            terminalreporter.write_line(f"every module's seconds: {self._record}")


def pytest_configure(config: pytest.Config) -> None:
    # On the controller only (or a run without workers): it sees every worker's reports.
    if not hasattr(config, "workerinput"):
        record = config.getoption("--record-module-durations")
        plugin = ModuleSeconds(Path(record) if record else None)
        config.pluginmanager.register(plugin, "loraserve-module-seconds")
