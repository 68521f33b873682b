"""What an attack costs the people it is not aimed at (`make abuse`): a normal client's
latency in a closed loop before, during and after the attack, and the attacked server's
peak resident memory while it lasts, read from the kernel's own high-water mark."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import grpc
import pytest

from loraserve.testing.attacks import Tally, Work, kept_up
from loraserve.testing.plugins.figures import add_figure

MIB = 1024 * 1024
# The bounds: a normal client's p99 within this factor of before the attack, and
# the server's peak RSS within this much of its RSS before it.
LATENCY_FACTOR = 2.0
PEAK_RSS_BOUND = 256 * MIB

# One normal request: its latency in seconds (to the first token, for Generate).
Probe = Callable[[], Awaitable[float]]


class PeakMemory:
    """A process's resident memory, and its peak since `reset` (the kernel's VmHWM, which
    writing 5 to clear_refs resets): every page it touched counts, however briefly, with
    no sampling interval to miss it."""

    def __init__(self, pid: int) -> None:
        self._proc = Path("/proc") / str(pid)

    def reset(self) -> None:
        (self._proc / "clear_refs").write_text("5")

    def rss(self) -> int:
        return self._status("VmRSS")

    def peak(self) -> int:
        return self._status("VmHWM")

    def _status(self, key: str) -> int:
        try:
            status = (self._proc / "status").read_text()
        except FileNotFoundError:
            raise AssertionError(f"the server ({self._proc.name}) exited") from None
        for line in status.splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {key} in {self._proc}/status")


@dataclass
class Window:
    """A closed loop's outcomes over one window: each request's latency, each failure's
    status code."""

    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def p99(self) -> float:
        """The 99th percentile latency (nearest rank), in seconds."""
        ordered = sorted(self.latencies)
        if not ordered:
            return math.inf
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def closed_loop(probe: Probe, clients: int, seconds: float) -> Window:
    """`clients` clients each sending `probe` again as soon as the last one ended, for
    `seconds`."""
    window = Window()
    deadline = time.monotonic() + seconds

    async def client() -> None:
        while time.monotonic() < deadline:
            try:
                window.latencies.append(await probe())
            except grpc.aio.AioRpcError as error:
                window.failures.append(error.code().name)

    await asyncio.gather(*(client() for _ in range(clients)))
    return window


@dataclass
class AttackFigures:
    """One attack's cost: the normal client's windows and the server's memory."""

    name: str
    before: Window
    during: Window
    after: Window
    rss_before: int
    peak_during: int

    @property
    def peak_growth(self) -> int:
        return self.peak_during - self.rss_before

    def report(self, config: pytest.Config) -> None:
        """Adds the figures to the run's summary (`reliability figures`)."""
        for phase in ("before", "during", "after"):
            window: Window = getattr(self, phase)
            add_figure(config, f"abuse.{self.name}.p99_ms.{phase}", round(window.p99 * 1000))
            add_figure(config, f"abuse.{self.name}.requests.{phase}", len(window.latencies))
        add_figure(config, f"abuse.{self.name}.rss_before_mib", round(self.rss_before / MIB))
        add_figure(config, f"abuse.{self.name}.peak_rss_growth_mib", round(self.peak_growth / MIB))

    def check(self) -> None:
        """The issue's bounds: no normal request failed, its p99 during and after within
        LATENCY_FACTOR of before, the peak within PEAK_RSS_BOUND of before."""
        failed = {p: getattr(self, p).failures for p in ("before", "during", "after")}
        assert not any(failed.values()), f"{self.name}: normal requests failed: {failed}"
        bound = LATENCY_FACTOR * self.before.p99
        p99s = {p: round(getattr(self, p).p99 * 1000) for p in ("before", "during", "after")}
        assert max(self.during.p99, self.after.p99) <= bound, f"{self.name}: p99 ms {p99s}"
        assert self.peak_growth <= PEAK_RSS_BOUND, (
            f"{self.name}: peak RSS grew {self.peak_growth / MIB:.0f} MiB"
        )


async def measure_attack(
    name: str,
    probe: Probe,
    attack: Callable[[], AbstractAsyncContextManager[object]],
    memory: PeakMemory,
    *,
    clients: int = 8,
    window_s: float = 10.0,
    warmup_s: float = 3.0,
) -> AttackFigures:
    """A warm-up (discarded), then a window before, during and after `attack`, the
    server's peak memory taken from just before the attack starts until it ends."""
    await closed_loop(probe, clients, warmup_s)
    before = await closed_loop(probe, clients, window_s)
    rss_before = memory.rss()
    memory.reset()
    async with attack():
        during = await closed_loop(probe, clients, window_s)
        peak_during = memory.peak()
    after = await closed_loop(probe, clients, window_s)
    return AttackFigures(name, before, during, after, rss_before, peak_during)


class Target(Protocol):
    """A server under attack, as `run_attack` sees it."""

    @property
    def label(self) -> str:
        """Names the server in the figures ("grpcio", "native", "store")."""

    @property
    def port(self) -> int:
        """The port its normal client uses."""

    @property
    def memory(self) -> PeakMemory: ...

    async def probe(self) -> float:
        """One normal request; its latency in seconds."""

    async def serving(self) -> bool:
        """Whether its Health says SERVING."""

    async def nothing_held(self, port: int) -> None:
        """Waits until nothing an attacker started on `port` is held."""


async def run_attack(
    target: Target,
    name: str,
    work: Callable[[int], Work],
    config: pytest.Config,
    port: int | None = None,
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Measures `work` on `port` (the target's own by default), with `meanwhile` run at
    the end of the attack; reports the figures and the attack's tally; checks the bounds,
    that Health said SERVING during and after, and that nothing is left held."""
    port = port or target.port
    tally: Tally = Tally()

    @asynccontextmanager
    async def attack() -> AsyncIterator[None]:
        async with kept_up(work(port)) as kept:
            try:
                yield
                assert await target.serving(), "Health said NOT_SERVING during the attack"
                if meanwhile is not None:
                    await meanwhile()
            finally:
                tally.update(kept)

    label = f"{target.label}.{name}"
    figures = await measure_attack(label, target.probe, attack, target.memory)
    figures.report(config)
    for key, value in tally.items():
        add_figure(config, f"abuse.{label}.{key}", value)
    figures.check()
    assert await target.serving(), "Health said NOT_SERVING after the attack"
    await target.nothing_held(port)
