"""`make bench-gpu`: the benchmarks whose figures depend on the engine's speed, in one run
that fits a 15-minute GPU window. Each runs under its own time budget (a benchmark over
its budget fails itself and the run goes on); the engines up at once share the device
by explicit `--gpu-memory-utilization` fractions (bench.rig.stack.PROFILES) that sum to at
most MEMORY_LIMIT (bench.plan checks every benchmark's). The models are the locally
built ones, nothing is downloaded.

Left out, each with the reason: benchmarks that start no engine (6, 12, 14, 15), and
those whose figures do not depend on the engine's speed and whose engine starts alone
would take minutes of the window (7: host memory by RSS, which is not the GPU's; 10
and 22: routing among three replicas, which on one device share it; 11: start-up and disk of
the adapter tiers, ten replica starts; 9: the tiny model's swap, which 16 and 17
measure with real-size adapters).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from bench.method.report import Report

WINDOW_S = 15 * 60
MEMORY_LIMIT = 0.9
# Benchmark -> its budget on a GPU (s), in the order the run makes them. Estimated from
# the gpu scales (bench.method.runs.GPU, bench.real.suite.GPU: 5 repeats of a 0.5 s warm-up and
# a 1 s window per arm, ~1.8 s a run with the load generator's own costs) plus about a
# minute for each group of engines starting together (3's engine C and 18's replica are
# inside their budgets).
BUDGETS_S = {
    1: 45,
    2: 65,
    8: 70,
    13: 150,
    3: 125,
    4: 40,
    5: 15,
    16: 40,
    17: 35,
    18: 80,
}
# Phases that serve several benchmarks, with their own budgets: the inference set-up
# (engines A, B and vLLM alone with B's flags start together), vLLM's own servers (8's
# and 13's competitors), and loraserve with vllm serve on the real base (16's and 17's).
PHASES_S = {"set-up": 90, "vLLM's servers": 60, "real servers": 60}
LEFT_OUT = {
    6: "starts no engine",
    12: "starts no engine",
    21: "starts no engine",
    14: "starts no engine",
    15: "starts no engine",
    7: "host memory by RSS: not the GPU's; its engine B alone costs a start",
    9: "the tiny model's swap; 16 and 17 measure it with real-size adapters",
    10: "three replicas on one device share it: routing, not engine speed",
    22: "three replicas on one device share it: a rollout's routing, not engine speed",
    11: "ten replica starts for start-up and disk figures, not engine speed",
    19: "its open-loop windows at 10x flood need minutes; run it on its own",
    20: "two replica pairs and an 80 MB model build; the check's cost is CPU, not GPU",
}


@dataclass
class Budget:
    """Per-benchmark time limits: on with `--engine gpu`, off otherwise."""

    enabled: bool

    @contextlib.asynccontextmanager
    async def limit(
        self, report: Report, number: int, *, phase: str = "", fatal: bool = False
    ) -> AsyncIterator[None]:
        """Runs the body within benchmark `number`'s budget (or `phase`'s, charged to
        `number`); over it, the benchmark's section fails with the reason and the run
        goes on (`fatal`: raises, for a set-up the next benchmarks need)."""
        seconds = PHASES_S[phase] if phase else BUDGETS_S.get(number)
        if not self.enabled or seconds is None:
            yield
            return
        started = time.monotonic()
        try:
            async with asyncio.timeout(seconds):
                yield
        except TimeoutError:
            mine = [s for s in report.sections if s.number == number]
            section = mine[-1] if mine else report.section(number, f"Benchmark {number}")
            what = f"{phase}: over its" if phase else "over its"
            section.error = (
                f"{what} GPU budget of {seconds} s (stopped after "
                f"{time.monotonic() - started:.0f} s)"
            )
            report.print_section(section)
            if fatal:
                raise


# Budget.limit's signature, for code that is handed it.
Limit = Callable[..., AbstractAsyncContextManager[None]]


def expected_total_s() -> int:
    """The GPU run's time if every benchmark and phase used its whole budget."""
    return sum(BUDGETS_S.values()) + sum(PHASES_S.values())


def only_argument() -> str:
    """`--only` for the GPU run."""
    return ",".join(str(n) for n in BUDGETS_S if n)
