"""Benchmark 4: hot-swap under load. A new revision of `swap` is pushed every second
while a closed loop (the load generator, its own process) keeps engine A busy: push ->
first token served by the new revision, throughput in the storm vs the steady windows
around it (per-second bins), and failed requests. (Benchmark 5 is bench.swap.cold.)"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from pathlib import Path

from bench.load.calls import grpc_caller, no_retry_client
from bench.load.drive import Timing
from bench.load.loadclient import Arm, LoadGenerator, Window
from bench.load.targets import Target
from bench.load.workload import Record, Workload, stream_into
from bench.method.report import Report
from bench.method.runs import Scale, closed, warm_up
from bench.rig import storeops
from bench.rig.stack import ENGINE_A, Stack, current_revisions, tenant, wait_routed
from bench.rig.variants import write_variant
from bench.swap.hot_figures import (
    BINS_FROM_S,
    WARMUP_S,
    Storm,
    plot,
    record_storms,
    storm_goals,
    storm_tables,
)

SWAP = "swap"
PROBE_EVERY_S = 0.05


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


@dataclass(frozen=True)
class StormPlan:
    label: str
    tenants: int
    concurrency: int
    swaps: int
    steady_s: float
    max_tokens: int


async def _storm(stack: Stack, gen: LoadGenerator, plan: StormPlan) -> tuple[Storm, Arm]:
    host = stack.host
    assert host is not None
    address = host.child.address
    background = Workload(
        adapters=(*(tenant(i) for i in range(plan.tenants)), SWAP),
        concurrency=plan.concurrency,
        requests=10_000,
        max_tokens=plan.max_tokens,
    )
    arm = closed("background", Target("grpc", address), background, plan.concurrency, host.pid)
    variants = await fresh_variants(stack, plan.swaps)
    t0 = time.monotonic()
    storm_start = t0 + plan.steady_s
    storm_end = storm_start + plan.swaps
    until = storm_end + plan.steady_s
    load = asyncio.create_task(gen.run(arm, Timing(WARMUP_S, until - t0 - WARMUP_S)))
    # The probes run through the steady windows too, so both windows carry the same load.
    stop = asyncio.Event()
    probes: list[Record] = []
    prober = asyncio.create_task(_prober(address, stop, probes))
    routed: dict[int, float] = {}
    watcher = asyncio.create_task(_watch_routes(address, stop, routed))
    pushes = await _push_each_second(stack, variants, storm_start)
    window = await load
    stop.set()
    await prober
    await watcher
    storm = _storm_figures(plan.label, len(background.adapters), pushes, probes, routed, window)
    storm.timeline = (t0, storm_start, storm_end, until)
    return storm, arm


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
    result: Window,
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


async def hot_swap(report: Report, stack: Stack, gen: LoadGenerator, scale: Scale) -> None:
    section = report.section(4, "Hot-swap under load")
    started = time.monotonic()
    assert stack.host is not None
    first = await push_fresh(stack, (await fresh_variants(stack, 1))[0])
    # With its prefetch set full (after 3, 32 adapters), the replica routes a new name
    # lazily: the first request loads it; every later revision of it loads on its push.
    await wait_routed(stack.host.child.address, {SWAP: first}, loaded=False)
    await warm_up(stack.host.child.address, (SWAP,))
    await wait_routed(stack.host.child.address, {SWAP: first})
    half = scale.slot_concurrency // 4
    full_plan = StormPlan(
        "all 8 slots busy", 7, half, scale.storm_swaps, scale.steady_s, scale.slot_tokens
    )
    spare_plan = StormPlan(
        "one slot spare",
        6,
        half,
        max(scale.storm_swaps // 2, 5),
        scale.steady_s / 2,
        scale.slot_tokens,
    )
    full, background = await _storm(stack, gen, full_plan)
    spare, spare_background = await _storm(stack, gen, spare_plan)
    section.workload += [
        f"background (load generator, its own process): {background.describe()}",
        f"storm: {full_plan.swaps} pushes of a new revision of `{SWAP}` (rank 8, new "
        "weights every push, so no upload is deduplicated), one per second, each hashed "
        "and uploaded as adapterctl push does (hashing included in push time); steady "
        f"windows of {full_plan.steady_s:g} s before and after (the first {BINS_FROM_S:g} s "
        "discarded); throughput in 1-second bins",
        f"probe: a 1-token request for `{SWAP}` every {PROBE_EVERY_S * 1000:.0f} ms, in the "
        "steady windows as in the storm; swap latency = push start -> first token of the "
        "first probe served by the new revision or a newer one (a revision superseded "
        "before any probe saw it counts as unseen, and took effect with its successor)",
        f"engine A: max_loras {ENGINE_A.max_loras}, max_cpu_loras {ENGINE_A.max_cpu_loras}",
        f"second storm, one LoRA slot left spare: {spare_background.describe()}, "
        f"{spare_plan.swaps} pushes, steady windows of {spare_plan.steady_s:g} s",
    ]
    storms = (full, spare)
    storm_tables(section, storms)
    record_storms(section, storms)
    storm_goals(section, storms)
    section.notes.append(
        "push -> routed is the service's part (store commit, watch event, download, sha256, "
        "add_lora, route). After routing, the new revision is one more distinct adapter: with "
        "every LoRA slot held by running requests (old revision included), vLLM's scheduler "
        "keeps its requests waiting until a slot frees, i.e. until a running request ends."
    )
    plot(report, section, full)
    section.seconds = time.monotonic() - started
    report.print_section(section)
