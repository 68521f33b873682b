"""Benchmarks 4 and 5: hot-swap under load, and cold start after a push.

4. A new revision of `swap` is pushed every second while a closed loop keeps engine A
   busy: push -> first token served by the new revision, throughput in the storm vs the
   steady windows around it, and failed requests.
5. On an idle engine: TTFT of the first request after a push (once routed) vs the next.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass
from pathlib import Path

from bench import storeops
from bench.calls import grpc_caller, no_retry_client
from bench.report import Report, Section
from bench.runs import Scale
from bench.stack import ENGINE_A, Stack, current_revisions, tenant, wait_routed
from bench.stats import median, percentile, ratio
from bench.variants import write_variant
from bench.workload import Record, RunResult, Workload, run_closed_loop, stream_into

SWAP = "swap"
PROBE_EVERY_S = 0.05
BIN_S = 1.0


@dataclass
class Push:
    started: float
    committed: float
    revision: int


async def _watch_routes(address: str, stop: asyncio.Event, routed: dict[int, float]) -> None:
    """Records when each revision of `swap` became current, polling every 50 ms."""
    while not stop.is_set():
        revision = (await current_revisions(address)).get(SWAP)
        if revision is not None:
            routed.setdefault(revision, time.monotonic())
        await asyncio.sleep(PROBE_EVERY_S)


async def _prober(address: str, stop: asyncio.Event, probes: list[Record]) -> None:
    """Sends a one-token request for `swap` every 50 ms; records what served each."""
    async with no_retry_client(address) as client:
        call = grpc_caller(client)

        async def probe() -> None:
            record = Record(SWAP, time.monotonic())
            probes.append(record)
            await stream_into(record, call, [5, 17, 42, 99], 1)

        tasks: list[asyncio.Task[None]] = []
        while not stop.is_set():
            tasks.append(asyncio.create_task(probe()))
            await asyncio.sleep(PROBE_EVERY_S)
        await asyncio.gather(*tasks)


def _tokens_per_s(records: list[Record], start: float, end: float) -> float:
    """Tokens generated inside [start, end), each request's spread evenly over the time
    between its first token and its end (closed loops finish in waves otherwise)."""
    tokens = 0.0
    for r in records:
        if r.error or not r.tokens:
            continue
        span = r.finished - r.first_token
        if span <= 0:
            tokens += r.tokens if start <= r.finished < end else 0
            continue
        overlap = min(end, r.finished) - max(start, r.first_token)
        tokens += r.tokens * max(0.0, overlap) / span
    return tokens / (end - start)


@dataclass
class Storm:
    """One storm's measurements."""

    label: str
    adapters: int
    latencies: list[float]
    unseen: int
    missed: int
    to_route: list[float]
    probe_ttft: list[float]
    push_s: list[float]
    requests: int
    failures: int
    records: list[Record]
    steady: float = float("nan")
    storm: float = float("nan")
    timeline: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)


async def fresh_variants(stack: Stack, count: int) -> list[Path]:
    """`count` adapters with weights never pushed before (written before any timing)."""
    paths = []
    for _ in range(count):
        seed = next(_SEEDS)
        out = stack.work / f"swap-variant-{seed}"
        paths.append(await asyncio.to_thread(write_variant, stack.adapters["swap-v0"], out, seed))
    return paths


# Seeds of the weights pushed so far in this run: every push gets its own.
_SEEDS = itertools.count(10_000)


async def push_fresh(stack: Stack, directory: Path) -> int:
    """What `adapterctl push` does for a directory it has not seen: hash, then upload."""
    assert stack.store_channel is not None
    files = await storeops.hashed(directory)
    return await storeops.push(storeops.store_stub(stack.store_channel), SWAP, files)


def swap_latencies(pushes: list[Push], probes: list[Record]) -> tuple[list[float], int, int]:
    """Per push: start -> first token of the first probe served by its revision or a
    newer one (a push superseded before any probe saw it took effect then). Returns
    (latencies, pushes no probe saw served by their own revision, pushes never seen)."""
    served = [p for p in probes if p.tokens]
    latencies: list[float] = []
    unseen = missed = 0
    for push in pushes:
        unseen += not any(p.revision == push.revision for p in served)
        firsts = [p.first_token for p in served if p.revision >= push.revision]
        if firsts:
            latencies.append(min(firsts) - push.started)
        else:
            missed += 1
    return latencies, unseen, missed


async def _storm(
    stack: Stack,
    label: str,
    tenants: int,
    concurrency: int,
    swaps: int,
    steady_s: float,
    max_tokens: int,
) -> tuple[Storm, Workload]:
    assert stack.host is not None
    address = stack.host.child.address
    background = Workload(
        adapters=(*(tenant(i) for i in range(tenants)), SWAP),
        concurrency=concurrency,
        requests=10_000,
        max_tokens=max_tokens,
    )
    variants = await fresh_variants(stack, swaps)
    t0 = time.monotonic()
    storm_start = t0 + steady_s
    storm_end = storm_start + swaps
    until = storm_end + steady_s
    async with no_retry_client(address) as client:
        load = asyncio.create_task(run_closed_loop(background, grpc_caller(client), until))
        # The probes run through the steady windows too, so both windows carry the same load.
        stop = asyncio.Event()
        probes: list[Record] = []
        prober = asyncio.create_task(_prober(address, stop, probes))
        routed: dict[int, float] = {}
        watcher = asyncio.create_task(_watch_routes(address, stop, routed))
        pushes = await _push_each_second(stack, variants, storm_start)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        stop.set()
        await prober
        await watcher
        result: RunResult = await load
    storm = _storm_figures(label, len(background.adapters), pushes, probes, routed, result)
    storm.timeline = (t0, storm_start, storm_end, until)
    storm.steady = (
        _tokens_per_s(result.records, t0 + 1.0, storm_start)
        + _tokens_per_s(result.records, storm_end, until)
    ) / 2
    storm.storm = _tokens_per_s(result.records, storm_start, storm_end)
    return storm, background


async def _push_each_second(stack: Stack, variants: list[Path], start: float) -> list[Push]:
    """Pushes each variant, one a second from `start` (time.monotonic())."""
    pushes: list[Push] = []
    for i, directory in enumerate(variants):
        await asyncio.sleep(max(0.0, start + i - time.monotonic()))
        pushed_at = time.monotonic()
        revision = await push_fresh(stack, directory)
        pushes.append(Push(pushed_at, time.monotonic(), revision))
    return pushes


def _storm_figures(
    label: str,
    adapters: int,
    pushes: list[Push],
    probes: list[Record],
    routed: dict[int, float],
    result: RunResult,
) -> Storm:
    """A storm's swap latencies, routes and failures (its throughput and timeline are
    the caller's to fill in)."""
    latencies, unseen, missed = swap_latencies(pushes, probes)
    return Storm(
        label=label,
        adapters=adapters,
        latencies=latencies,
        unseen=unseen,
        missed=missed,
        to_route=[routed[p.revision] - p.started for p in pushes if p.revision in routed],
        probe_ttft=[p.first_token - p.submitted for p in probes if p.tokens],
        push_s=[p.committed - p.started for p in pushes],
        requests=len(result.records) + len(probes),
        failures=result.failures + sum(1 for p in probes if p.error),
        records=result.records,
    )


async def hot_swap(report: Report, stack: Stack, scale: Scale) -> None:
    section = report.section(4, "Hot-swap under load")
    started = time.monotonic()
    assert stack.host is not None
    first = await push_fresh(stack, (await fresh_variants(stack, 1))[0])
    await wait_routed(stack.host.child.address, {SWAP: first})
    full, background = await _storm(
        stack,
        "all 8 slots busy",
        7,
        scale.concurrency // 2,
        scale.storm_swaps,
        scale.steady_s,
        scale.slot_tokens,
    )
    spare_swaps = max(scale.storm_swaps // 2, 2)
    spare, spare_background = await _storm(
        stack,
        "one slot spare",
        6,
        scale.concurrency // 2,
        spare_swaps,
        scale.steady_s / 2,
        scale.slot_tokens,
    )
    section.workload += [
        f"background closed loop: {background.describe()} (repeating until the end)",
        f"storm: {scale.storm_swaps} pushes of a new revision of `{SWAP}` (rank 8, new "
        "weights every push, so no upload is deduplicated), one per second, each hashed "
        "and uploaded as adapterctl push does (hashing included in push time); steady "
        f"windows of {scale.steady_s:.0f} s before and after",
        f"probe: a 1-token request for `{SWAP}` every {PROBE_EVERY_S * 1000:.0f} ms, in the "
        "steady windows as in the storm; swap latency = push start -> first token of the "
        "first probe served by the new revision or a newer one (a revision superseded "
        "before any probe saw it counts as unseen, and took effect with its successor)",
        f"engine A: max_loras {ENGINE_A.max_loras}, max_cpu_loras {ENGINE_A.max_cpu_loras}",
        f"second storm, one LoRA slot left spare: {spare_background.describe()}, "
        f"{spare_swaps} pushes, steady windows of {scale.steady_s / 2:.0f} s",
    ]
    storms = (full, spare)
    _storm_tables(section, storms)
    _record_storms(section, storms)
    _storm_goals(section, storms)
    section.notes.append(
        "push -> routed is the service's part (store commit, watch event, download, sha256, "
        "add_lora, route). After routing, the new revision is one more distinct adapter: with "
        "every LoRA slot held by running requests (old revision included), vLLM's scheduler "
        "keeps its requests waiting until a slot frees, i.e. until a running request ends."
    )
    _plot(report, section, full)
    section.seconds = time.monotonic() - started
    report.print_section(section)


def _storm_tables(section: Section, storms: tuple[Storm, ...]) -> None:
    section.table(
        "Swap latency: push start -> first token from the new revision (ms)",
        [
            "storm",
            "swaps",
            "unseen (superseded)",
            "never seen",
            "p50",
            "p95",
            "max",
            "push RPC p50",
            "push -> routed p50",
            "probe TTFT p50",
        ],
        [
            [
                s.label,
                len(s.push_s),
                s.unseen,
                s.missed,
                median(s.latencies) * 1000,
                percentile(s.latencies, 95) * 1000,
                max(s.latencies, default=float("nan")) * 1000,
                median(s.push_s) * 1000,
                median(s.to_route) * 1000,
                median(s.probe_ttft) * 1000,
            ]
            for s in storms
        ],
    )
    section.table(
        "Throughput of the background load (tok/s)",
        ["storm", "steady (mean of before/after)", "storm", "ratio", "requests", "failed"],
        [
            [s.label, s.steady, s.storm, ratio(s.storm, s.steady), s.requests, s.failures]
            for s in storms
        ],
    )


def _record_storms(section: Section, storms: tuple[Storm, ...]) -> None:
    """Every swap of every storm in results.json: a push is a storm's repeat."""
    for s in storms:
        section.record_values(f"{s.label}: push -> first token", "seconds", s.latencies)
        section.record_values(f"{s.label}: push RPC", "seconds", s.push_s)
        section.record_values(f"{s.label}: push -> routed", "seconds", s.to_route)
        section.record(
            f"{s.label}: background load",
            [{"steady_tokens_per_s": s.steady, "storm_tokens_per_s": s.storm}],
        )


def _storm_goals(section: Section, storms: tuple[Storm, ...]) -> None:
    for s in storms:
        p50 = median(s.latencies)
        met = p50 < 1.0 and not s.missed
        section.goal(f"swap latency p50 (s), {s.label}", p50, "< 1, none missed", met, ".3f")
        section.goal(
            f"swap latency p95 (s), {s.label}",
            percentile(s.latencies, 95),
            "reported",
            None,
            ".3f",
        )
    full = storms[0]
    storm_ratio = ratio(full.storm, full.steady)
    section.goal("storm / steady tok/s", storm_ratio, ">= 0.9", storm_ratio >= 0.9, ".2f")
    failures = sum(s.failures for s in storms)
    section.goal("failed requests in the storms", failures, "0", failures == 0, "d")


def _plot(report: Report, section: Section, storm: Storm) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records, latencies = storm.records, storm.latencies
    t0, storm_start, storm_end, until = storm.timeline
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    bins = int((until - t0) / BIN_S)
    xs = [i * BIN_S for i in range(bins)]
    ys = [_tokens_per_s(records, t0 + x, t0 + x + BIN_S) for x in xs]
    left.plot(xs, ys, drawstyle="steps-post")
    left.axvspan(storm_start - t0, storm_end - t0, alpha=0.15, color="red", label="push storm")
    left.set_xlabel("seconds")
    left.set_ylabel("tokens/s (by completion)")
    left.set_title("Throughput while pushing a revision every second")
    left.legend()
    right.hist([x * 1000 for x in latencies], bins=15)
    right.set_xlabel("push -> first token of new revision (ms)")
    right.set_ylabel("swaps")
    right.set_title("Swap latency")
    report.save_figure(section, "hot_swap.png", figure)
    plt.close(figure)


COLD_PROMPT_TOKENS = 8
COLD_OUTPUT_TOKENS = 8


async def _ttft(address: str, adapter: str, seed: int) -> tuple[float, int]:
    """TTFT of one request, read to its end (the next starts on an idle engine); each
    seed gives another prompt of the same length, so no request reuses another's cache."""
    rng = random.Random(seed)
    prompt = [rng.randrange(3, 512) for _ in range(COLD_PROMPT_TOKENS)]
    ttft = float("nan")
    served = 0
    async with no_retry_client(address) as client:
        call = grpc_caller(client)
        submitted = time.monotonic()
        async for tokens, revision in call(adapter, prompt, COLD_OUTPUT_TOKENS):
            if tokens and ttft != ttft:
                ttft = time.monotonic() - submitted
            served = served or revision
    if ttft != ttft:
        raise RuntimeError("no token")
    return ttft, served


async def cold_start(report: Report, stack: Stack, scale: Scale) -> None:
    section = report.section(5, "Cold start: first request after a push vs warm")
    started = time.monotonic()
    assert stack.host is not None
    address = stack.host.child.address
    section.workload += [
        f"idle engine A; {scale.cold_pairs} times: push new weights as a revision of "
        f"`{SWAP}`, poll ListAdapters every 50 ms until it is current and READY, then one "
        f"request ({COLD_PROMPT_TOKENS}-token prompt, {COLD_OUTPUT_TOKENS} output tokens, "
        "read to its end) = cold, then another of the same lengths (a different prompt) "
        "= warm",
    ]
    cold: list[float] = []
    warm: list[float] = []
    routed: list[float] = []
    wrong = 0
    variants = await fresh_variants(stack, scale.cold_pairs)
    for i, directory in enumerate(variants):
        pushed_at = time.monotonic()
        revision = await push_fresh(stack, directory)
        await wait_routed(address, {SWAP: revision})
        routed.append(time.monotonic() - pushed_at)
        cold_s, served = await _ttft(address, SWAP, 2 * i)
        warm_s, _ = await _ttft(address, SWAP, 2 * i + 1)
        wrong += served != revision
        cold.append(cold_s)
        warm.append(warm_s)
    revisions = await current_revisions(address)
    section.record_values("cold (first request on the new revision)", "ttft_s", cold)
    section.record_values("warm (next request)", "ttft_s", warm)
    section.record_values("push start -> routed (idle)", "seconds", routed)
    section.table(
        "TTFT (ms)",
        ["", "p50", "max"],
        [
            ["cold (first request on the new revision)", median(cold) * 1000, max(cold) * 1000],
            ["warm (next request)", median(warm) * 1000, max(warm) * 1000],
            ["push start -> routed (idle)", median(routed) * 1000, max(routed) * 1000],
        ],
    )
    value = ratio(median(cold), median(warm))
    section.goal("cold / warm TTFT (medians)", value, "<= 1.2", value <= 1.2, ".2f")
    if wrong:
        section.notes.append(f"{wrong} cold requests were served by another revision")
    section.notes.append(f"final revision of {SWAP}: {revisions.get(SWAP)}")
    section.seconds = time.monotonic() - started
    report.print_section(section)
