"""Arms run side by side: every repeat runs each arm once for one steady-state window,
the order rotating each repeat, so drift in the machine's load hits every arm alike;
one arm runs twice per repeat (its second run named "<arm> (again)") and the ratio of
the two is the benchmark's noise. Figures are medians over repeats of per-repeat
ratios (bench.method.stats), tables show every arm's medians with their intervals."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

from bench.load.drive import Timing
from bench.load.loadclient import Arm, Window
from bench.method.report import Cell, Goal, Section
from bench.method.stats import Estimate, Op, median_interval, paired_ratio

AGAIN = " (again)"
Around = Callable[[str], AbstractAsyncContextManager[None]]


def _nothing(_: str) -> AbstractAsyncContextManager[None]:
    return nullcontext()


def rotated(names: Sequence[str], repeat: int) -> list[str]:
    """The arms' order in repeat `repeat`: rotated by one each repeat."""
    shift = repeat % len(names)
    return [*names[shift:], *names[:shift]]


@dataclass
class Runs:
    """Every arm's windows, one per repeat, in the order the repeats ran."""

    windows: dict[str, list[Window]] = field(default_factory=dict)
    noise_arm: str = ""

    def values(self, arm: str, metric: str) -> list[float]:
        return [w.metric(metric) for w in self.windows[arm]]

    def estimate(self, arm: str, metric: str) -> Estimate:
        return median_interval(self.values(arm, metric))

    def ratio(self, numerator: str, denominator: str, metric: str) -> Estimate:
        return paired_ratio(self.values(numerator, metric), self.values(denominator, metric))

    def failures(self) -> int:
        return sum(w.failures for windows in self.windows.values() for w in windows)

    def first_failure(self) -> str:
        return next(
            (
                f"{arm}: {r.error}"
                for arm, windows in self.windows.items()
                for w in windows
                for r in w.records
                if r.error
            ),
            "",
        )


class ArmRunner(Protocol):
    """What runs one arm for one window: a LoadGenerator, or several as one."""

    async def run(self, arm: Arm, timing: Timing) -> Window: ...


async def paired(
    gen: ArmRunner,
    arms: Sequence[Arm],
    timing: Timing,
    repeats: int,
    noise: str = "",
    around: Around = _nothing,
) -> Runs:
    """Runs every arm (and `noise` a second time) once per repeat, order rotated."""
    by_name = {arm.name: arm for arm in arms}
    names = list(by_name)
    if noise:
        names.append(noise + AGAIN)
        by_name[noise + AGAIN] = by_name[noise]
    runs = Runs({name: [] for name in names}, noise)
    for repeat in range(repeats):
        for name in rotated(names, repeat):
            async with around(name):
                runs.windows[name].append(await gen.run(by_name[name], timing))
    return runs


def record(section: Section, runs: Runs) -> None:
    """Every repeat of every arm in results.json."""
    for arm, windows in runs.windows.items():
        section.record(arm, [w.summary() for w in windows])


def ratio_goal(
    section: Section,
    runs: Runs,
    figure: str,
    arms: tuple[str, str],
    metric: str,
    op: Op,
    threshold: float,
    *,
    clear: float | None = None,
    fmt: str = ".3f",
) -> str:
    """The goal on median(per-repeat numerator / denominator of `metric`)."""
    numerator, denominator = arms
    missing = [a for a in arms if a not in runs.windows]
    if missing:
        # A competitor that could not start is a miss, not an absent row.
        section.goals.append(
            Goal(figure, f"{', '.join(missing)} did not start", f"{op} {threshold:g}", "missed")
        )
        return "missed"
    estimate = runs.ratio(numerator, denominator, metric)
    return section.goal(figure, estimate, op, threshold, fmt, clear=clear, metric=metric)


def noise_figures(section: Section, runs: Runs, metrics: Sequence[str]) -> None:
    """The noise arm's ratio to itself for each metric."""
    if not runs.noise_arm:
        return
    arm = runs.noise_arm
    for metric in metrics:
        section.noise(
            f"{arm}, {metric}, measured twice", runs.ratio(arm, arm + AGAIN, metric), metric
        )


def close(section: Section, runs: Runs, noise_metrics: Sequence[str]) -> None:
    """What every steady-state benchmark ends with: every repeat in results.json, the
    noise arm's figures for `noise_metrics`, and the check that no request failed."""
    record(section, runs)
    noise_figures(section, runs, noise_metrics)
    failure_check(section, runs)


def failure_check(section: Section, runs: Runs) -> None:
    """Every request of every arm and repeat succeeded."""
    failures = runs.failures()
    section.check("failed requests, every arm and repeat", failures, "0", failures == 0)
    if failures:
        section.notes.append(f"first failed request: {runs.first_failure()}")
    reconnects = sum(w.reconnects for ws in runs.windows.values() for w in ws)
    if reconnects:
        section.notes.append(
            f"{reconnects} HTTP requests were sent again on a new connection after the "
            "server closed an idle pooled one (uvicorn's keep-alive), counted, not failed"
        )


ARM_METRICS = (
    ("tok/s", "tokens_per_s", ".0f"),
    ("TTFT p50 ms", "ttft_p50_ms", ".0f"),
    ("TTFT p99 ms", "ttft_p99_ms", ".0f"),
    ("ITL p50 ms", "itl_p50_ms", ".1f"),
    ("ITL p99 ms", "itl_p99_ms", ".1f"),
    ("front CPU ms / 1k tok", "front_cpu_ms_per_1k", ".0f"),
)


def arm_table(
    section: Section,
    runs: Runs,
    title: str = "Every arm: median [95 % interval] over repeats",
    metrics: Sequence[tuple[str, str, str]] = ARM_METRICS,
) -> None:
    rows: list[list[Cell]] = []
    for arm, windows in runs.windows.items():
        row: list[Cell] = [arm]
        for _, metric, fmt in metrics:
            row.append(runs.estimate(arm, metric).text(fmt).rsplit(" n=", 1)[0])
        row.append(sum(w.failures for w in windows))
        rows.append(row)
    section.table(title, ["arm", *(label for label, _, _ in metrics), "failed"], rows)
