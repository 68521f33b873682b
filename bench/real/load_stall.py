"""Benchmark 18 (profile real): a load's effect on running streams. A closed loop of 16
streams (the load generator, its own process) runs on adapters already loaded; in the
"loads" arm the driver meanwhile sends first requests to adapters the replica never
loaded, one after another (each waits for its first token: download, checksum, engine
load), so some adapter is always loading. Inter-token latency of the running streams,
loads vs no loads, arms paired per repeat (issue 24: p99 <= 1.2x)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from bench.load.calls import grpc_caller, no_retry_client
from bench.load.drive import Timing
from bench.load.loadclient import LoadGenerator
from bench.load.targets import Target
from bench.load.workload import Record, Workload, stream_into
from bench.method import paired
from bench.method.report import Section
from bench.method.runs import closed
from bench.method.stats import median_interval

LOADS = "16 streams, adapters loading one after another"
QUIET = "16 streams, no loads"
GOAL = 1.2
PROMPT = (5, 17, 42, 99)
# Before each loads window the pool holds this many times the most loads one window has
# used, so an hour with faster loads than the first repeat's cannot run it dry.
HEADROOM = 2
SETTLE_S = 5.0


class NeverLoaded:
    """Names of adapters the replica has never loaded, each used once; `push(n)` pushes n
    more to the store and returns their names."""

    def __init__(self, names: list[str], push: Callable[[int], Awaitable[list[str]]]) -> None:
        self._names = deque(names)
        self._push = push

    def __len__(self) -> int:
        return len(self._names)

    def take(self) -> str:
        if not self._names:
            raise RuntimeError("out of never-loaded adapters: push more")
        return self._names.popleft()

    async def top_up(self, most_per_window: int) -> int:
        """Between windows, never during one: pushing costs the store and the machine.
        How many it pushed."""
        wanted = HEADROOM * most_per_window
        if len(self._names) >= wanted:
            return 0
        pushed = await self._push(wanted - len(self._names))
        self._names.extend(pushed)
        return len(pushed)


@dataclass
class Loader:
    """Sends one-token first requests to never-loaded adapters, one at a time."""

    address: str
    names: NeverLoaded
    done: list[Record] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        async with no_retry_client(self.address) as client:
            call = grpc_caller(client)
            while not stop.is_set():
                record = Record(self.names.take(), time.monotonic())
                await stream_into(record, call, PROMPT, 1)
                self.done.append(record)


@dataclass
class StallRuns:
    runs: paired.Runs
    loads: list[list[Record]]


async def measure(
    gen: LoadGenerator,
    address: str,
    front_pid: int,
    streams: Workload,
    cold: NeverLoaded,
    timing: Timing,
    repeats: int,
) -> StallRuns:
    target = Target("grpc", address)
    concurrency = streams.concurrency
    arms = [
        closed(QUIET, target, streams, concurrency, front_pid),
        closed(LOADS, target, streams, concurrency, front_pid),
    ]
    loader = Loader(address, cold)
    loads: list[list[Record]] = []

    @contextlib.asynccontextmanager
    async def loading(arm: str) -> AsyncIterator[None]:
        if arm != LOADS:
            yield
            return
        stop = asyncio.Event()
        first = len(loader.done)
        task = asyncio.create_task(loader.run(stop))
        try:
            yield
        finally:
            stop.set()
            await task
            loads.append(loader.done[first:])
            # After the window, and time for what a push leaves running (the store's
            # writes, the replica's change events) to end before the next arm's.
            if await cold.top_up(max(len(window) for window in loads)):
                await asyncio.sleep(SETTLE_S)

    runs = await paired.paired(gen, arms, timing, repeats, noise=QUIET, around=loading)
    return StallRuns(runs, loads)


def figures(section: Section, measured: StallRuns) -> None:
    runs = measured.runs
    paired.arm_table(
        section,
        runs,
        metrics=(
            ("tok/s", "tokens_per_s", ".1f"),
            ("ITL p50 ms", "itl_p50_ms", ".0f"),
            ("ITL p99 ms", "itl_p99_ms", ".0f"),
            ("longest gap ms", "itl_max_ms", ".0f"),
        ),
    )
    loads = measured.loads
    section.record(
        "loads",
        [{"loads": len(r), "failed": sum(1 for x in r if x.error)} for r in loads],
    )
    ttfts = [x.ttft * 1000 for r in loads for x in r if not x.error]
    section.table(
        "The loads (first requests to never-loaded adapters)",
        ["loads per window run", "first token of a load (ms)", "failed"],
        [
            [
                median_interval([float(len(r)) for r in loads]).text(".0f"),
                median_interval(ttfts).text(".0f"),
                sum(1 for r in loads for x in r if x.error),
            ]
        ],
    )
    paired.ratio_goal(
        section,
        runs,
        "running streams' ITL p99, loads / no loads",
        (LOADS, QUIET),
        "itl_p99_ms",
        "<=",
        GOAL,
    )
    section.reported(
        "running streams' ITL p50, loads / no loads", runs.ratio(LOADS, QUIET, "itl_p50_ms"), ".2f"
    )
    section.reported(
        "running streams' longest gap, loads / no loads",
        runs.ratio(LOADS, QUIET, "itl_max_ms"),
        ".2f",
    )
    paired.close(section, runs, ("itl_p99_ms",))
    failed = sum(1 for r in loads for x in r if x.error)
    section.check("failed loads", failed, "0", not failed)
