"""Workloads (which adapter each request goes to, prompt, output length) and a
closed-loop driver that runs one against any way of calling the engine."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.method.stats import median, percentile

# Prompt token ids are drawn above the tiny tokenizer's special tokens (pad, bos, eos).
_FIRST_TOKEN_ID = 3


@dataclass(frozen=True)
class Workload:
    """A closed loop: `concurrency` streams, each sending its next request when the
    previous one ends, until `requests` have been sent."""

    adapters: tuple[str, ...]  # "" is the base model
    concurrency: int
    requests: int
    max_tokens: int
    prompt_tokens: int = 16
    # "uniform" or "zipf:S": the k-th adapter gets weight 1 / k**S
    popularity: str = "uniform"
    seed: int = 0
    vocab_size: int = 512

    def describe(self) -> str:
        return f"{self.mix()}; {self.concurrency} concurrent streams, {self.requests} requests"

    def mix(self) -> str:
        """The requests, without how many or how concurrently (arms with a load say that)."""
        names = [a or "<base>" for a in self.adapters]
        shown = ", ".join(names) if len(names) <= 8 else f"{names[0]} .. {names[-1]}"
        return (
            f"{len(self.adapters)} adapter(s) [{shown}], {self.popularity} popularity, "
            f"{self.prompt_tokens} prompt + {self.max_tokens} output tokens each (greedy, "
            f"ignore_eos), seed {self.seed}"
        )

    def weights(self) -> list[float]:
        if self.popularity == "uniform":
            return [1.0] * len(self.adapters)
        kind, _, exponent = self.popularity.partition(":")
        if kind != "zipf":
            raise ValueError(f"unknown popularity {self.popularity!r}")
        return [1.0 / (k + 1) ** float(exponent) for k in range(len(self.adapters))]

    def schedule(self) -> list[tuple[str, list[int]]]:
        """(adapter, prompt token ids) per request, the same for every arm."""
        rng = random.Random(self.seed)
        if self.popularity == "uniform":
            # Round robin after a shuffle: every adapter gets its exact share.
            order = [self.adapters[i % len(self.adapters)] for i in range(self.requests)]
            rng.shuffle(order)
        else:
            order = rng.choices(self.adapters, weights=self.weights(), k=self.requests)
        return [
            (
                adapter,
                [
                    rng.randrange(_FIRST_TOKEN_ID, self.vocab_size)
                    for _ in range(self.prompt_tokens)
                ],
            )
            for adapter in order
        ]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        return cls(**{**data, "adapters": tuple(data["adapters"])})


@dataclass
class Record:
    """One request as the client saw it; times are time.monotonic() seconds."""

    adapter: str
    submitted: float
    first_token: float = 0.0
    finished: float = 0.0
    tokens: int = 0
    revision: int = 0
    error: str = ""

    @property
    def ttft(self) -> float:
        return self.first_token - self.submitted


# Streams (new token count, served revision) for (adapter, prompt ids, max_tokens).
Caller = Callable[[str, Sequence[int], int], AsyncIterator[tuple[int, int]]]


@dataclass
class RunResult:
    records: list[Record] = field(default_factory=list)

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if not r.error]

    @property
    def failures(self) -> int:
        return sum(1 for r in self.records if r.error)

    @property
    def tokens_per_s(self) -> float:
        ok = self.ok
        if not ok:
            return 0.0
        span = max(r.finished for r in ok) - min(r.submitted for r in ok)
        return sum(r.tokens for r in ok) / span if span > 0 else 0.0

    def ttfts(self, adapters: set[str] | None = None) -> list[float]:
        return [r.ttft for r in self.ok if adapters is None or r.adapter in adapters]

    def ttft_p(self, q: float, adapters: set[str] | None = None) -> float:
        return percentile(self.ttfts(adapters), q)

    def ttft_median(self) -> float:
        return median(self.ttfts())

    def summary(self) -> dict[str, float | int]:
        """One repeat in a few numbers (results.json keeps these, not every request)."""
        return {
            "requests": len(self.records),
            "failures": self.failures,
            "tokens": sum(r.tokens for r in self.ok),
            "tokens_per_s": round(self.tokens_per_s, 2),
            "ttft_p50_ms": round(self.ttft_p(50) * 1000, 2),
            "ttft_p99_ms": round(self.ttft_p(99) * 1000, 2),
        }

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> RunResult:
        return cls([Record(**r) for r in data])


async def stream_into(record: Record, call: Caller, prompt: Sequence[int], max_tokens: int) -> None:
    """Streams one request for `record.adapter` into `record` (first token, tokens,
    revision, end); a failure is recorded, never raised."""
    try:
        async for new_tokens, revision in call(record.adapter, prompt, max_tokens):
            if new_tokens and not record.tokens:
                record.first_token = time.monotonic()
            record.revision = record.revision or revision
            record.tokens += new_tokens
    except Exception as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.finished = time.monotonic()


async def run_closed_loop(
    workload: Workload, call: Caller, until: float | None = None
) -> RunResult:
    """Runs the workload; a failed request is recorded, never raised. With `until`
    (a time.monotonic() deadline) no request starts after it, and the schedule repeats
    until then."""
    schedule = workload.schedule()
    queue = list(reversed(schedule))
    result = RunResult()

    async def stream_worker() -> None:
        while queue or until is not None:
            if until is not None:
                if time.monotonic() >= until:
                    return
                if not queue:
                    queue.extend(reversed(schedule))
            adapter, prompt = queue.pop()
            record = Record(adapter, time.monotonic())
            result.records.append(record)
            await stream_into(record, call, prompt, workload.max_tokens)

    await asyncio.gather(*(stream_worker() for _ in range(workload.concurrency)))
    return result
