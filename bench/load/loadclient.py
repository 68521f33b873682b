"""The benchmark driver's side of the load generator: `LoadGenerator` starts
`python -m bench.load.loadgen` (its own process), sends it one arm run at a time and turns
each reply into a `Window`: one repeat of one arm at steady state."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.load.drive import Load, Timing
from bench.load.targets import Target
from bench.load.workload import Record, Workload
from bench.method.stats import percentile, ratio


@dataclass(frozen=True)
class Arm:
    """One way of serving the workload: the target, the load, and the processes
    whose CPU time per token the arm records (`watch`: role -> pid; "front" is the
    server's API/gRPC process, never its engine-core child)."""

    name: str
    target: Target
    workload: Workload
    load: Load
    watch: tuple[tuple[str, int], ...] = ()

    def describe(self) -> str:
        return f"{self.name}: {self.load.describe()}; {self.workload.mix()}"


@dataclass
class Window:
    """One measured window of one arm (see bench.load.drive)."""

    seconds: float
    tokens: int
    records: list[Record]
    itl: dict[str, float]
    cpu_s: dict[str, float]
    unfinished: int = 0
    failures_outside: int = 0
    reconnects: int = 0
    extra: dict[str, float] = field(default_factory=dict)
    start: float = 0.0

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> Window:
        start, stop = reply["window"]
        return cls(
            start=start,
            seconds=stop - start,
            tokens=int(reply["tokens"]),
            records=[Record(**r) for r in reply["records"]],
            itl={k: float(v) for k, v in reply["itl"].items()},
            cpu_s={k: float(v) for k, v in reply["cpu_s"].items()},
            unfinished=int(reply["unfinished"]),
            failures_outside=int(reply["failures_outside"]),
            reconnects=int(reply.get("reconnects", 0)),
        )

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if not r.error]

    def _inside(self, t: float) -> bool:
        return self.start <= t < self.start + self.seconds

    @property
    def failures(self) -> int:
        """Requests of the window that failed or never answered, and failures outside it."""
        return sum(1 for r in self.records if r.error) + self.unfinished + self.failures_outside

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.nan

    def cpu_per_1k(self, role: str) -> float:
        """CPU seconds of `role`'s processes per 1,000 tokens streamed in the window (an
        arm over several servers watches "front", "front_1", ...: summed)."""
        seconds = [v for k, v in self.cpu_s.items() if k == role or k.startswith(role + "_")]
        if not seconds:
            return math.nan
        return ratio(sum(seconds), self.tokens / 1000)

    def ttft_p(self, q: float, adapters: set[str] | None = None) -> float:
        """Of the requests submitted in the window."""
        return percentile(
            [
                r.ttft
                for r in self.ok
                if r.first_token
                and self._inside(r.submitted)
                and (adapters is None or r.adapter in adapters)
            ],
            q,
        )

    def e2e_p(self, q: float) -> float:
        """Of the requests that ended in the window."""
        return percentile(
            [r.finished - r.submitted for r in self.ok if r.finished and self._inside(r.finished)],
            q,
        )

    def metric(self, name: str) -> float:
        """A figure of this window by name (what goals and tables ask for)."""
        simple = {
            "tokens_per_s": self.tokens_per_s,
            "front_cpu_ms_per_1k": self.cpu_per_1k("front") * 1000,
            "client_cpu_ms_per_1k": self.cpu_per_1k("client") * 1000,
            "ttft_p50_ms": self.ttft_p(50) * 1000,
            "ttft_p99_ms": self.ttft_p(99) * 1000,
            "itl_p50_ms": self.itl["p50"] * 1000,
            "itl_p99_ms": self.itl["p99"] * 1000,
            "itl_max_ms": self.itl["max"] * 1000,
            "e2e_p50_ms": self.e2e_p(50) * 1000,
            "e2e_p99_ms": self.e2e_p(99) * 1000,
            "failures": float(self.failures),
        }
        if name in simple:
            return simple[name]
        return self.extra[name]

    def summary(self) -> dict[str, float | int]:
        """One repeat in a few numbers (results.json keeps these, not every request)."""
        figures: dict[str, float | int] = {
            "requests": len(self.records),
            "failures": self.failures,
            "reconnects": self.reconnects,
            "tokens": self.tokens,
            "window_s": round(self.seconds, 3),
        }
        for name in (
            "tokens_per_s",
            "ttft_p50_ms",
            "ttft_p99_ms",
            "itl_p50_ms",
            "itl_p99_ms",
            "e2e_p50_ms",
            "e2e_p99_ms",
            "front_cpu_ms_per_1k",
            "client_cpu_ms_per_1k",
        ):
            value = self.metric(name)
            if not math.isnan(value):
                figures[name] = round(value, 3)
        figures.update({k: round(v, 4) for k, v in self.extra.items()})
        return figures


class LoadGenError(RuntimeError):
    """The load generator could not run an arm (its message says why)."""


class LoadGenerator:
    """`python -m bench.load.loadgen` as a child process; `run` one arm at a time."""

    def __init__(self, log_dir: Path, name: str = "loadgen") -> None:
        self._log_dir = log_dir
        self._name = name
        self._process: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def start(self) -> LoadGenerator:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        with (self._log_dir / f"{self._name}.log").open("ab") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.load.loadgen",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                limit=1 << 26,
            )
        return self

    async def run(self, arm: Arm, timing: Timing) -> Window:
        """Runs `arm` for one window; raises LoadGenError if the generator could not."""
        process = self._process
        assert process is not None
        assert process.stdin is not None
        assert process.stdout is not None
        message = {
            "target": arm.target.to_json(),
            "workload": arm.workload.to_json(),
            "load": vars(arm.load),
            "timing": vars(timing),
            "watch": dict(arm.watch),
        }
        async with self._lock:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            await process.stdin.drain()
            line = await process.stdout.readline()
        if not line:
            raise LoadGenError(f"the load generator exited ({self._log_dir / self._name}.log)")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise LoadGenError(f"{arm.name}: {reply['error']}")
        return Window.from_reply(reply)

    async def close(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def __aenter__(self) -> LoadGenerator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
