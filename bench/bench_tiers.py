"""Benchmark 11: thousands of adapters per replica (lazy adapter tiers).

Two stores on one moto S3, seeded through the push API: one with `few` adapters, one
with `many` (the same 32 distinct weights under many names; content-addressed, so the
store keeps each once, while a replica's cache holds a copy per revision). Side by side
in one run:

1. and 6. A fresh replica (empty `--adapter-cache`) started on each store in turn,
   order rotated each repeat: process start -> gRPC health SERVING, and the RSS of its
   process tree (the server and vLLM's engine core) once SERVING; many ÷ few.
2. On a replica of the big store: one request at a time to adapters it never loaded
   (TTFT = first streamed response, download and load included), then the same again.
3. 16 concurrent first requests for one never-loaded adapter: the replica's download
   counter across them.
5. tokens/s of Zipf(1.1) traffic over all `many` adapters vs over 32 of them, same
   replica, same requests, arms interleaved; the 32 are warmed first.
4. Bytes of the files under the replica's adapter cache after that traffic, with
   `--adapter-cache-size` at 10 % of the `many` adapters' bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import storeops
from bench.calls import grpc_caller
from bench.report import Report, Section
from bench.stack import TENANTS, Stack, model_description, tenant
from bench.tiers_figures import (
    MIB,
    FirstRequest,
    Start,
    cold_ttft_figures,
    disk_figures,
    rotated,
    rss_goal,
    singleflight_figures,
    start_order,
    startup_figures,
    throughput_figures,
    tier_table,
)
from bench.tiers_rig import CACHE_BYTES, ENGINE, Replica, Rig, adapter_name, disk_use, seed
from bench.tiers_rig import metric_or_nan as metric_value
from bench.workload import Caller, Record, RunResult, Workload, run_closed_loop, stream_into
from loraserve.clients.inference import InferenceClient, RetryPolicy

NUMBER = 11
PROMPT = (5, 17, 42, 99)
PROBE_TOKENS = 4
# A load on miss waits within the request's deadline; this one only stops a hung run.
CALL_TIMEOUT_S = 300.0
DISK_EVERY_S = 0.5
PICK_SEED = 11


@dataclass(frozen=True)
class TiersScale:
    many: int = 2000
    few: int = 20
    head: int = 32  # adapters of the small Zipf arm
    repeats: int = 3  # replica starts per store, and throughput runs per arm
    cold: int = 30
    concurrent: int = 16
    concurrency: int = 32
    requests: int = 256
    max_tokens: int = 32
    zipf: float = 1.1
    cache_share: float = 0.10
    prefetch: int = 32
    seed_concurrency: int = 16


# 400, not fewer: the cache bound (10 %, 40 adapters) must still hold the prefetch set and
# the small Zipf arm's 32, or that arm would measure disk thrash instead of the baseline.
QUICK = TiersScale(many=400, repeats=1, cold=10, concurrency=16, requests=64, max_tokens=8)


def _client(address: str) -> InferenceClient:
    """No retries (a failure is reported, not hidden) and a deadline for hung calls."""
    return InferenceClient(address, retry=RetryPolicy(max_attempts=1), timeout=CALL_TIMEOUT_S)


async def _starts(rig: Rig, scale: TiersScale) -> tuple[dict[str, list[Start]], Replica]:
    """Figures 1 and 6: fresh replicas on each store, one at a time; keeps the last
    (on the big store) running."""
    stores = {"few": rig.few_store, "many": rig.many_store}
    starts: dict[str, list[Start]] = {arm: [] for arm in stores}
    order = start_order("few", "many", scale.repeats)
    kept: Replica | None = None
    for i, arm in enumerate(order):
        replica = rig.start(f"tiers-{arm}-{i}", stores[arm])
        seconds = await rig.serving(replica)
        starts[arm].append(Start(seconds, replica.rss_mib()))
        if i == len(order) - 1:
            kept = replica
        else:
            rig.stop(replica)
    assert kept is not None
    return starts, kept


async def _alone(replica: Replica, call: Caller, adapter: str) -> FirstRequest:
    """One request with nothing else running, and the downloads it caused."""
    before = await replica.downloads()
    record = Record(adapter, time.monotonic())
    await stream_into(record, call, PROMPT, PROBE_TOKENS)
    return FirstRequest(record, await replica.downloads() - before)


async def _cold_and_warm(
    section: Section, replica: Replica, call: Caller, adapters: list[str]
) -> None:
    """Figure 2."""
    cold = [await _alone(replica, call, a) for a in adapters]
    warm = [await _alone(replica, call, a) for a in adapters]
    cold_ttft_figures(section, cold, warm)


async def _singleflight(
    section: Section, replica: Replica, call: Caller, adapter: str, count: int
) -> None:
    """Figure 3."""
    before = await replica.downloads()
    records = [Record(adapter, time.monotonic()) for _ in range(count)]
    await asyncio.gather(*(stream_into(r, call, PROMPT, PROBE_TOKENS) for r in records))
    singleflight_figures(section, await replica.downloads() - before, records)


async def _watch_disk(root: Path, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], (await asyncio.to_thread(disk_use, root)).total)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), DISK_EVERY_S)


async def _traffic(
    section: Section, replica: Replica, call: Caller, arms: dict[str, list[str]], scale: TiersScale
) -> tuple[dict[str, list[RunResult]], dict[str, list[float]], int]:
    """Figure 5's runs: the arms interleaved, order rotated, a new Zipf draw each repeat
    (the same for both arms). Returns them, the downloads during each, and the peak of
    the cache's bytes sampled meanwhile."""
    head = arms[list(arms)[-1]]
    await run_closed_loop(
        Workload(adapters=tuple(head), concurrency=8, requests=len(head), max_tokens=2), call
    )
    template = Workload(
        adapters=(),
        concurrency=scale.concurrency,
        requests=scale.requests,
        max_tokens=scale.max_tokens,
        popularity=f"zipf:{scale.zipf}",
    )
    section.workload.append(
        f"Zipf arms, per arm and repeat: {template.describe().split(', ', 1)[1]} (the seed "
        f"is the repeat's); repeats: {scale.repeats}, order rotated; the {len(head)} head "
        "adapters warmed first (one request each)"
    )
    stop, peak = asyncio.Event(), [0]
    watcher = asyncio.create_task(_watch_disk(replica.cache_dir, stop, peak))
    results: dict[str, list[RunResult]] = {arm: [] for arm in arms}
    downloads: dict[str, list[float]] = {arm: [] for arm in arms}
    try:
        for rep in range(scale.repeats):
            for arm in rotated(list(arms), rep):
                workload = dataclasses.replace(template, adapters=tuple(arms[arm]), seed=rep)
                before = await replica.downloads()
                results[arm].append(await run_closed_loop(workload, call))
                downloads[arm].append(await replica.downloads() - before)
    finally:
        stop.set()
        await watcher
    return results, downloads, peak[0]


async def _measure(section: Section, stack: Stack, scale: TiersScale, quick: bool) -> None:
    stack.build_models()
    sources = [await storeops.hashed(stack.adapters[tenant(i)]) for i in range(TENANTS)]
    names = [adapter_name(i) for i in range(scale.many)]
    total = sum(sources[i % len(sources)].total_size for i in range(scale.many))
    bound = int(total * scale.cache_share)
    rig = Rig(stack, bound, scale.prefetch)
    few_channel, many_channel = await rig.start_stores()
    seeding = time.monotonic()
    try:
        await seed(few_channel, names[: scale.few], sources, scale.seed_concurrency)
        await seed(many_channel, names, sources, scale.seed_concurrency)
    finally:
        await few_channel.close()
        await many_channel.close()
    section.workload += [
        *(
            ["smoke run (--quick): fewer adapters, one repeat; not figures to quote"]
            if quick
            else []
        ),
        f"stores: {scale.few} and {scale.many:,} adapters ({TENANTS} distinct weights, "
        f"{total / scale.many / MIB:.2f} MiB each), pushed through the push API "
        f"{scale.seed_concurrency} at a time in {time.monotonic() - seeding:.0f} s",
        f"replicas: `inference serve` max_loras {ENGINE.max_loras}, max_cpu_loras "
        f"{ENGINE.max_cpu_loras}, --prefetch-adapters {scale.prefetch}, --adapter-cache-size "
        f"{bound} ({scale.cache_share:.0%} of the {scale.many:,} adapters' {total / MIB:.0f} MiB), "
        f"empty cache at each start; {model_description()}",
        f"start-up: fresh replicas, {scale.repeats} per store, one at a time, order rotated",
        f"first requests: {scale.cold} adapters drawn (seed {PICK_SEED}) outside the "
        f"{scale.head} Zipf head, one request each ({len(PROMPT)} prompt + {PROBE_TOKENS} "
        f"tokens), then the same again; then {scale.concurrent} at once for one more",
    ]
    load_before = os.getloadavg()[0]
    starts, replica = await _starts(rig, scale)
    section.notes.append(
        f"1-minute load average of the machine ({os.cpu_count()} cores) before and after the "
        f"starts: {load_before:.1f}, {os.getloadavg()[0]:.1f} (start-up is mostly vLLM's "
        "imports and engine start, which other processes slow down)"
    )
    few = (f"{scale.few} adapters", starts["few"])
    many = (f"{scale.many:,} adapters", starts["many"])
    startup_figures(section, few, many)
    picks = random.Random(PICK_SEED).sample(names[scale.head :], scale.cold + 1)
    async with _client(replica.address) as client:
        call = grpc_caller(client)
        # Connects the channel before any request is timed.
        await stream_into(Record("", time.monotonic()), call, PROMPT, 1)
        await _cold_and_warm(section, replica, call, picks[:-1])
        await _singleflight(section, replica, call, picks[-1], scale.concurrent)
        arms = {f"Zipf over {scale.many:,}": names, f"Zipf over {scale.head}": names[: scale.head]}
        results, downloads, peak = await _traffic(section, replica, call, arms, scale)
    samples = await replica.samples()
    disk_figures(
        section,
        disk=await asyncio.to_thread(disk_use, replica.cache_dir),
        gauge=metric_value(samples, CACHE_BYTES),
        peak=peak,
        bound=bound,
    )
    throughput_figures(section, results, downloads, *arms)
    rss_goal(section, few, many)
    tier_table(section, samples)


async def run(report: Report, *, quick: bool) -> None:
    """Benchmark 11."""
    scale = QUICK if quick else TiersScale()
    section = report.section(
        NUMBER, f"Thousands of adapters per replica: {scale.many:,} vs {scale.few} in the store"
    )
    stack = Stack(report.results_dir, Path(tempfile.mkdtemp(prefix="bench-tiers-")))
    started = time.monotonic()
    try:
        await _measure(section, stack, scale, quick)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        section.seconds = time.monotonic() - started
        report.print_section(section)
        await stack.close()
