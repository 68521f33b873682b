"""Benchmark 5 (and the real profile's cold first request): a first request that finds
nothing cached. Each pair pushes new weights under a name never pushed before and sends
its first request the moment the push returns (sent again while the replica answers
NOT_FOUND, i.e. has not seen the push yet), so the request waits for everything a cold
adapter costs: the change event, the download, the checksum, the engine load. Then the
same adapter again (warm), twice (the second warm request is the noise arm)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench.load.calls import grpc_caller, no_retry_client
from bench.method.report import Report, Section
from bench.method.stats import median_interval, paired_difference, paired_ratio
from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.clients.inference import InferenceClient
from loraserve.common.errors import NotFound

PROMPT_TOKENS = 8
OUTPUT_TOKENS = 8
NOT_FOUND_RETRY_S = 0.005
COLD_MARGIN_MS = 150.0


@dataclass
class Cold:
    """Every pair's seconds: push RPC, push start -> first token, and the TTFT of the
    cold request (from its first attempt), the warm one and the warm one again."""

    push_s: list[float] = field(default_factory=list)
    to_first_token: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    warm_again: list[float] = field(default_factory=list)
    not_found: int = 0
    wrong_revision: int = 0


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 512) for _ in range(PROMPT_TOKENS)]


async def ttft(client: InferenceClient, adapter: str, seed: int) -> tuple[float, int, int]:
    """(TTFT from the first attempt, revision served, NOT_FOUND answers before it) of one
    request read to its end; attempts again while the replica does not know `adapter`."""
    call = grpc_caller(client)
    submitted = time.monotonic()
    attempts = 0
    while True:
        first = 0.0
        served = 0
        try:
            async for tokens, revision in call(adapter, _prompt(seed), OUTPUT_TOKENS):
                if tokens and not first:
                    first = time.monotonic()
                served = served or revision
        except NotFound:
            attempts += 1
            await asyncio.sleep(NOT_FOUND_RETRY_S)
            continue
        if not first:
            raise RuntimeError(f"{adapter}: no token")
        return first - submitted, served, attempts


Variant = Callable[[int], Awaitable[AdapterFiles]]
Push = Callable[[str, AdapterFiles], Awaitable[int]]


async def measure(
    address: str, pairs: int, variant: Variant, push: Push, prefix: str = "cold"
) -> Cold:
    """`pairs` cold adapters: `variant(i)` writes and hashes new weights (untimed),
    `push(name, files)` pushes them (returns the revision)."""
    measured = Cold()
    async with no_retry_client(address) as client:
        for i in range(pairs):
            files = await variant(i)
            name = f"{prefix}-{i:03d}"
            started = time.monotonic()
            revision = await push(name, files)
            pushed = time.monotonic()
            cold_s, served, misses = await ttft(client, name, 3 * i)
            measured.to_first_token.append(pushed - started + cold_s)
            measured.push_s.append(pushed - started)
            measured.cold.append(cold_s)
            measured.not_found += misses
            measured.wrong_revision += served != revision
            measured.warm.append((await ttft(client, name, 3 * i + 1))[0])
            measured.warm_again.append((await ttft(client, name, 3 * i + 2))[0])
    return measured


def figures(section: Section, measured: Cold, margin_ms: float = COLD_MARGIN_MS) -> None:
    """Tables, goals and noise of a cold-request run."""
    ms = {
        k: [v * 1000 for v in getattr(measured, k)]
        for k in ("push_s", "to_first_token", "cold", "warm", "warm_again")
    }
    section.record(
        "pairs",
        [dict(zip(ms, values, strict=True)) for values in zip(*ms.values(), strict=True)],
    )
    section.table(
        "Cold and warm requests (ms): median [95 % interval]",
        ["figure", "median [interval]"],
        [
            ["push RPC (hashing excluded)", median_interval(ms["push_s"]).text(".0f")],
            [
                "push start -> first token of the cold request",
                median_interval(ms["to_first_token"]).text(".0f"),
            ],
            [
                "cold TTFT (first request, sent as the push returned)",
                median_interval(ms["cold"]).text(".0f"),
            ],
            ["warm TTFT (the next request)", median_interval(ms["warm"]).text(".0f")],
        ],
    )
    added = paired_difference(ms["cold"], ms["warm"])
    section.goal(
        "cold TTFT - warm TTFT (ms): change event, download, checksum and load",
        added,
        "<=",
        margin_ms,
        ".0f",
    )
    section.reported("push start -> first token (ms)", median_interval(ms["to_first_token"]), ".0f")
    section.noise(
        "warm TTFT measured twice", paired_ratio(ms["warm"], ms["warm_again"]), "warm ttft"
    )
    section.check(
        "cold requests served by another revision",
        measured.wrong_revision,
        "0",
        not measured.wrong_revision,
    )
    if measured.not_found:
        section.notes.append(
            f"{measured.not_found} NOT_FOUND answers (the replica had not seen the push yet) "
            "were sent again; their time is in the cold TTFT"
        )


async def cold_start(
    report: Report, address: str, pairs: int, variant: Variant, push: Push, describe: list[str]
) -> None:
    """Benchmark 5 on a running replica."""
    section = report.section(5, "Cold start: the first request for an adapter nothing cached")
    started = time.monotonic()
    section.workload += [
        f"{pairs} pairs on an idle replica: push new weights (never pushed) under a new "
        f"name, then at once a request ({PROMPT_TOKENS}-token prompt, {OUTPUT_TOKENS} "
        "output tokens, read to its end; sent again while the replica answers NOT_FOUND) "
        "= cold; then the same adapter twice more = warm, and warm again (the noise arm)",
        *describe,
    ]
    measured = await measure(address, pairs, variant, push)
    figures(section, measured)
    section.seconds = time.monotonic() - started
    report.print_section(section)
