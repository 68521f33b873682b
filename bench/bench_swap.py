"""Benchmarks 4 and 5: hot-swap under load, and cold start after a push.

4. A new revision of `swap` is pushed every second while a closed loop keeps engine A
   busy: push -> first token served by the new revision, throughput in the storm vs the
   steady windows around it, and failed requests.
5. On an idle engine: TTFT of the first request after a push (once routed) vs the next.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bench.calls import grpc_caller, no_retry_client
from bench.report import Report
from bench.runs import Scale
from bench.stack import ENGINE_A, SWAP_VARIANTS, Stack, current_revisions, tenant, wait_routed
from bench.stats import median, percentile, ratio
from bench.workload import Record, RunResult, Workload, run_closed_loop

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
            try:
                async for tokens, revision in call(SWAP, [5, 17, 42, 99], 1):
                    if tokens and not record.tokens:
                        record.first_token = time.monotonic()
                    record.revision = record.revision or revision
                    record.tokens += tokens
            except Exception as exc:
                record.error = f"{type(exc).__name__}: {exc}"
            record.finished = time.monotonic()

        tasks: list[asyncio.Task[None]] = []
        while not stop.is_set():
            tasks.append(asyncio.create_task(probe()))
            await asyncio.sleep(PROBE_EVERY_S)
        await asyncio.gather(*tasks)


def _tokens_per_s(records: list[Record], start: float, end: float) -> float:
    tokens = sum(r.tokens for r in records if not r.error and start <= r.finished < end)
    return tokens / (end - start)


async def hot_swap(report: Report, stack: Stack, scale: Scale) -> None:
    section = report.section(4, "Hot-swap under load")
    started = time.monotonic()
    assert stack.host is not None
    address = stack.host.child.address
    first = await stack.push(SWAP, "swap-v0")
    await wait_routed(address, {SWAP: first})
    background = Workload(
        adapters=(*(tenant(i) for i in range(7)), SWAP),
        concurrency=scale.concurrency // 2,
        requests=10_000,
        max_tokens=scale.slot_tokens,
    )
    section.workload += [
        f"background closed loop: {background.describe()} (repeating until the end)",
        f"storm: {scale.storm_swaps} pushes of a new revision of `{SWAP}` (rank 8, "
        f"{SWAP_VARIANTS} weight variants in turn), one per second, by adapterctl's upload; "
        f"steady windows of {scale.steady_s:.0f} s before and after",
        f"probe: a 1-token request for `{SWAP}` every {PROBE_EVERY_S * 1000:.0f} ms; swap "
        "latency = push start -> first token of the first request served by the new revision",
        f"engine A: max_loras {ENGINE_A.max_loras}, max_cpu_loras {ENGINE_A.max_cpu_loras}",
    ]
    t0 = time.monotonic()
    storm_start = t0 + scale.steady_s
    storm_end = storm_start + scale.storm_swaps
    until = storm_end + scale.steady_s
    async with no_retry_client(address) as client:
        load = asyncio.create_task(run_closed_loop(background, grpc_caller(client), until))
        await asyncio.sleep(storm_start - time.monotonic())
        stop = asyncio.Event()
        probes: list[Record] = []
        prober = asyncio.create_task(_prober(address, stop, probes))
        routed: dict[int, float] = {}
        watcher = asyncio.create_task(_watch_routes(address, stop, routed))
        pushes: list[Push] = []
        for i in range(scale.storm_swaps):
            await asyncio.sleep(max(0.0, storm_start + i - time.monotonic()))
            pushed_at = time.monotonic()
            revision = await stack.push(SWAP, f"swap-v{(i + 1) % SWAP_VARIANTS}")
            pushes.append(Push(pushed_at, time.monotonic(), revision))
        await asyncio.sleep(max(0.0, storm_end + 1.0 - time.monotonic()))
        stop.set()
        await prober
        await watcher
        result: RunResult = await load
    latencies: list[float] = []
    to_route = [routed[p.revision] - p.started for p in pushes if p.revision in routed]
    old_ttft = [
        p.first_token - p.submitted
        for p in probes
        if p.tokens and p.revision not in {q.revision for q in pushes}
    ]
    all_ttft = [p.first_token - p.submitted for p in probes if p.tokens]
    superseded = 0
    for push in pushes:
        served = [p.first_token for p in probes if p.revision == push.revision and p.tokens]
        if served:
            latencies.append(min(served) - push.started)
        else:
            superseded += 1
    records = result.records
    steady = (
        _tokens_per_s(records, t0 + 1.0, storm_start) + _tokens_per_s(records, storm_end, until)
    ) / 2
    storm = _tokens_per_s(records, storm_start, storm_end)
    failures = result.failures + sum(1 for p in probes if p.error)
    push_s = [p.committed - p.started for p in pushes]
    section.table(
        "Swap latency: push start -> first token from the new revision (ms)",
        ["swaps", "served", "superseded", "p50", "p95", "max", "push RPC p50"],
        [
            [
                len(pushes),
                len(latencies),
                superseded,
                median(latencies) * 1000,
                percentile(latencies, 95) * 1000,
                max(latencies, default=float("nan")) * 1000,
                median(push_s) * 1000,
            ]
        ],
    )
    section.table(
        "Where swap latency goes (ms, medians)",
        ["push start -> routed (ListAdapters)", "probe TTFT under this load", "probes"],
        [[median(to_route) * 1000, median(all_ttft) * 1000, len(probes)]],
    )
    del old_ttft
    section.table(
        "Throughput (background load, tok/s)",
        ["steady (mean of before/after)", "storm", "ratio", "requests", "failed"],
        [[steady, storm, ratio(storm, steady), len(records) + len(probes), failures]],
    )
    p50 = median(latencies)
    section.goal("swap latency p50 (s)", p50, "< 1", p50 < 1.0, ".3f")
    section.goal("swap latency p95 (s)", percentile(latencies, 95), "reported", None, ".3f")
    storm_ratio = ratio(storm, steady)
    section.goal("storm / steady tok/s", storm_ratio, ">= 0.9", storm_ratio >= 0.9, ".2f")
    section.goal("failed requests in the storm", failures, "0", failures == 0, "d")
    _plot(report, section, records, latencies, t0, storm_start, storm_end, until)
    section.seconds = time.monotonic() - started
    report.print_section(section)


def _plot(
    report: Report,
    section: object,
    records: list[Record],
    latencies: list[float],
    t0: float,
    storm_start: float,
    storm_end: float,
    until: float,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.report import Section

    assert isinstance(section, Section)
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


async def _ttft(address: str, adapter: str) -> tuple[float, int]:
    async with no_retry_client(address) as client:
        call = grpc_caller(client)
        submitted = time.monotonic()
        async for tokens, revision in call(adapter, [5, 17, 42, 99, 3, 250, 7, 64], 8):
            if tokens:
                return time.monotonic() - submitted, revision
    raise RuntimeError("no token")


async def cold_start(report: Report, stack: Stack, scale: Scale) -> None:
    section = report.section(5, "Cold start: first request after a push vs warm")
    started = time.monotonic()
    assert stack.host is not None
    address = stack.host.child.address
    section.workload += [
        f"idle engine A; {scale.cold_pairs} times: push a new revision of `{SWAP}`, poll "
        "ListAdapters every 50 ms until it is current and READY, then one request (8-token "
        "prompt, 8 output tokens) = cold, then the same again = warm",
    ]
    cold: list[float] = []
    warm: list[float] = []
    routed: list[float] = []
    wrong = 0
    for i in range(scale.cold_pairs):
        pushed_at = time.monotonic()
        revision = await stack.push(SWAP, f"swap-v{i % SWAP_VARIANTS}")
        await wait_routed(address, {SWAP: revision})
        routed.append(time.monotonic() - pushed_at)
        cold_s, served = await _ttft(address, SWAP)
        warm_s, _ = await _ttft(address, SWAP)
        wrong += served != revision
        cold.append(cold_s)
        warm.append(warm_s)
    revisions = await current_revisions(address)
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
