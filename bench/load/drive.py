"""Steady-state load, run inside the load generator's own process (bench.load.loadgen).

A closed loop keeps `concurrency` streams busy, each sending its next request the
moment the previous one ends, the streams' first requests spread over the warm-up (with
equal lengths, streams started together would stay in lock-step waves forever); an open
loop sends requests at Poisson arrivals of a fixed rate, however many are in flight.
Either way the first `warmup_s` seconds are discarded and a window of `window_s` seconds
is measured: tokens/s and inter-token gaps count what arrived inside it, TTFT comes
from every request submitted inside it, end-to-end time from every request that ended
inside it. After the window the load runs on until each request submitted inside it
has its first token (so each was measured under the same load); then whatever is still
in flight is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.load.workload import Caller, Record, Workload
from bench.method.cpu import cpu_seconds
from bench.method.stats import percentile


@dataclass(frozen=True)
class Load:
    """How requests arrive: "closed" (concurrency streams back to back) or "poisson"
    (rate requests/s, open loop)."""

    mode: str = "closed"
    concurrency: int = 0
    rate: float = 0.0

    def describe(self) -> str:
        if self.mode == "closed":
            return f"closed loop of {self.concurrency} streams"
        return f"open loop, Poisson arrivals at {self.rate:g} requests/s"


@dataclass(frozen=True)
class Timing:
    warmup_s: float
    window_s: float
    # The longest the window's last requests may wait for their first token after it.
    drain_s: float = 300.0
    # Over how much of the warm-up a closed loop's streams start (None: all of it).
    ramp_s: float | None = None

    def describe(self) -> str:
        if self.ramp_s is None:
            return f"{self.warmup_s:g} s warm-up discarded, {self.window_s:g} s measured"
        return (
            f"{self.warmup_s:g} s warm-up discarded (the streams starting over its first "
            f"{self.ramp_s:g} s), {self.window_s:g} s measured"
        )


@dataclass(frozen=True)
class Windows:
    """A benchmark's steady-state runs: `repeats` windows of `window_s` seconds after
    `warmup_s` discarded (a closed loop's streams start spread over the warm-up)."""

    repeats: int = 5
    warmup_s: float = 3.0
    window_s: float = 8.0
    ramp_s: float | None = None

    @property
    def timing(self) -> Timing:
        return Timing(self.warmup_s, self.window_s, ramp_s=self.ramp_s)

    def describe(self) -> str:
        return (
            f"{self.repeats} repeats, arm order rotated each repeat; each arm run: "
            f"{self.timing.describe()}"
        )


@dataclass
class _State:
    workload: Workload
    call: Caller
    window: tuple[float, float]
    records: list[Record] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    in_window_open: int = 0
    window_done: asyncio.Event = field(default_factory=asyncio.Event)
    cut: set[int] = field(default_factory=set)

    def in_window(self, t: float) -> bool:
        return self.window[0] <= t < self.window[1]

    def _answered(self, counted: bool) -> None:
        """A request submitted in the window has its first token (or ended)."""
        if counted:
            self.in_window_open -= 1
            if not self.in_window_open and time.monotonic() >= self.window[1]:
                self.window_done.set()

    async def one(self, adapter: str, prompt: Sequence[int]) -> None:
        """Streams one request into a new record; a failure is recorded, never raised."""
        record = Record(adapter, time.monotonic())
        self.records.append(record)
        counted = self.in_window(record.submitted)
        self.in_window_open += counted
        waiting = counted
        last = 0.0
        try:
            async for count, revision in self.call(adapter, prompt, self.workload.max_tokens):
                if not count:
                    continue
                now = time.monotonic()
                inside = self.in_window(now)
                if record.tokens and inside:
                    self.gaps.append(now - last)
                if not record.tokens:
                    record.first_token = now
                    self._answered(waiting)
                    waiting = False
                last = now
                record.tokens += count
                record.revision = record.revision or revision
                if inside:
                    self.tokens += count
        except asyncio.CancelledError:
            self.cut.add(id(record))
            raise
        except Exception as exc:
            record.error = f"{type(exc).__name__}: {exc}"[:500]
        finally:
            record.finished = time.monotonic()
            self._answered(waiting)


async def _at(when: float, pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds of each watched process (and of this one, as "client") at `when`."""
    await asyncio.sleep(max(0.0, when - time.monotonic()))
    readings = {name: cpu_seconds(pid) for name, pid in pids.items()}
    readings["client"] = cpu_seconds(os.getpid())
    return readings


def _requests(
    load: Load, state: _State, ramp_s: float | None
) -> Callable[[], Coroutine[Any, Any, None]]:
    """The coroutine that sends requests until cancelled."""
    schedule = itertools.cycle(state.workload.schedule())

    async def closed_stream(delay: float) -> None:
        await asyncio.sleep(delay)
        while True:
            await state.one(*next(schedule))

    async def closed() -> None:
        ramp = max(0.0, state.window[0] - time.monotonic())
        if ramp_s is not None:
            ramp = min(ramp, ramp_s)
        spacing = ramp / max(load.concurrency, 1)
        await asyncio.gather(*(closed_stream(i * spacing) for i in range(load.concurrency)))

    async def poisson() -> None:
        rng = random.Random(state.workload.seed)
        due = time.monotonic()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                due += rng.expovariate(load.rate)
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                task = asyncio.create_task(state.one(*next(schedule)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return closed if load.mode == "closed" else poisson


async def drive(
    workload: Workload, load: Load, timing: Timing, call: Caller, pids: dict[str, int]
) -> dict[str, Any]:
    """Runs the load; returns the window's figures (see module docstring)."""
    start = time.monotonic()
    window = (start + timing.warmup_s, start + timing.warmup_s + timing.window_s)
    state = _State(workload, call, window)
    sender = asyncio.create_task(_requests(load, state, timing.ramp_s)())
    before, after = await asyncio.gather(_at(window[0], pids), _at(window[1], pids))
    if state.in_window_open:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(state.window_done.wait(), timing.drain_s)
    sender.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await sender
    return _figures(state, before, after, time.monotonic())


def _figures(
    state: _State, before: dict[str, float], after: dict[str, float], end: float
) -> dict[str, Any]:
    """The window's figures; `records`: every request submitted or ended inside it (a
    request cancelled at the end has `finished` 0: its end was not measured)."""
    start, stop = state.window
    records = []
    for r in state.records:
        cut = id(r) in state.cut
        if cut:
            r.finished = 0.0
        if state.in_window(r.submitted) or (not cut and state.in_window(r.finished)):
            records.append(r)
    unanswered = [r for r in records if not r.first_token and not r.error]
    failures_outside = sum(
        1
        for r in state.records
        if r.error and not state.in_window(r.submitted) and not state.in_window(r.finished)
    )
    gaps = state.gaps
    return {
        "window": [start, stop],
        "ended": end,
        "tokens": state.tokens,
        "records": [asdict(r) for r in records],
        "unfinished": len(unanswered),
        "failures_outside": failures_outside,
        "itl": {
            "n": len(gaps),
            **{f"p{q}": percentile(gaps, q) for q in (50, 90, 99)},
            "max": max(gaps, default=float("nan")),
        },
        "cpu_s": {name: after[name] - before[name] for name in after},
    }
