"""The same arm run by several load-generator processes at once, as one window.

A fleet is called by many services, each its own process with its own client: one
generator process would route every request through one client's view of the fleet (its
own in-flight counts), which is exactly what a bounded-load policy must do better than.
Each of `processes` generators runs the arm with an equal part of its concurrency and
its own draw of the workload's requests (seed + its index: clients of one fleet do not
send the same requests in the same order; with one draw for all, round robin's share of
an adapter's requests on its top replica ranged from 0.43 to 0.72 over one run's
windows); their windows start together and are merged: tokens per second summed over the
processes, every request's record kept, inter-token percentiles as the worst process's
(a conservative merge), server CPU as the first process measured it (each would measure
the same servers).
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import replace
from pathlib import Path

from bench.load.drive import Load, Timing
from bench.load.loadclient import Arm, LoadGenerator, Window


class LoadGenerators:
    """`processes` LoadGenerator processes driven as one (the `paired` interface)."""

    def __init__(self, log_dir: Path, processes: int, name: str = "loadgen") -> None:
        if processes < 1:
            raise ValueError(f"processes must be at least 1, got {processes}")
        self._gens = [LoadGenerator(log_dir, f"{name}-{i}") for i in range(processes)]

    @property
    def processes(self) -> int:
        return len(self._gens)

    async def start(self) -> LoadGenerators:
        await asyncio.gather(*(gen.start() for gen in self._gens))
        return self

    async def close(self) -> None:
        await asyncio.gather(*(gen.close() for gen in self._gens))

    async def run(self, arm: Arm, timing: Timing) -> Window:
        parts = _split(arm, len(self._gens))
        windows = await asyncio.gather(
            *(gen.run(part, timing) for gen, part in zip(self._gens, parts, strict=True))
        )
        return merge(windows)


def _split(arm: Arm, processes: int) -> list[Arm]:
    total = arm.load.concurrency
    if total < processes:
        raise ValueError(f"{arm.name}: concurrency {total} below {processes} processes")
    shares = [total // processes + (1 if i < total % processes else 0) for i in range(processes)]
    return [
        replace(
            arm,
            load=Load(arm.load.mode, concurrency=share, rate=arm.load.rate),
            workload=replace(arm.workload, seed=arm.workload.seed + i),
            # The servers' CPU is measured once, by the first process.
            watch=arm.watch if i == 0 else (),
        )
        for i, share in enumerate(shares)
    ]


def merge(windows: list[Window]) -> Window:
    """One window of several processes' concurrent windows of one arm."""
    seconds = statistics.fmean(w.seconds for w in windows)
    rate = sum(w.tokens_per_s for w in windows)
    itl_keys = set().union(*(w.itl for w in windows))
    return Window(
        start=min(w.start for w in windows),
        seconds=seconds,
        tokens=round(rate * seconds),
        records=[r for w in windows for r in w.records],
        itl={k: max(w.itl.get(k, 0.0) for w in windows) for k in itl_keys},
        cpu_s=dict(windows[0].cpu_s),
        unfinished=sum(w.unfinished for w in windows),
        failures_outside=sum(w.failures_outside for w in windows),
        reconnects=sum(w.reconnects for w in windows),
    )
