"""What several of bench/tests' modules build: a benchmark run's results.json."""

from __future__ import annotations

from pathlib import Path

from bench.method import measured_code, readme_table
from bench.method.report import Report
from bench.method.stats import Estimate


def write_run(
    results: Path,
    *,
    quick: bool,
    met: bool,
    numbers: tuple[int, ...] = (8,),
    value: float = 0,
    commit: str = "",
) -> Path:
    """A run's results.json, made at `commit` (default: this checkout's HEAD) with
    nothing uncommitted, whatever the working tree holds now."""
    report = Report(results, {"command": "python -m bench", "quick": quick})
    commit = commit or measured_code.head(readme_table.README.parent)[0]
    report.machine.update({"git commit": commit, "uncommitted code": ""})
    for number in numbers:
        section = report.section(number, f"Benchmark {number}")
        measured = value or (1.62 if met else 1.2)
        estimate = Estimate(measured, measured - 0.01, measured + 0.01, 5)
        section.goal(f"figure of {number}", estimate, ">=", 1.5, ".2f")
    report.write()
    return results / "results.json"
