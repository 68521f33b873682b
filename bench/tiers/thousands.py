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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench.load.calls import grpc_caller
from bench.load.drive import Windows
from bench.load.loadclient import LoadGenerator
from bench.load.targets import Target
from bench.load.workload import Caller, Record, Workload, stream_into
from bench.method.paired import Runs, paired
from bench.method.report import Report, Section
from bench.method.runs import closed, warm_up
from bench.rig import storeops
from bench.rig.stack import PROFILES, TENANTS, Stack, model_description, tenant
from bench.tiers.figures import (
    MIB,
    FirstRequest,
    Start,
    cold_ttft_figures,
    disk_figures,
    rss_after_figures,
    rss_goal,
    singleflight_figures,
    start_order,
    startup_figures,
    throughput_figures,
    tier_table,
)
from bench.tiers.rig import CACHE_BYTES, ENGINE, Replica, Rig, adapter_name, disk_use, seed
from bench.tiers.rig import metric_or_nan as metric_value
from loraserve.clients.inference import InferenceClient, RetryPolicy

NUMBER = 11
PROMPT = (5, 17, 42, 99)
PROBE_TOKENS = 4
# A load on miss waits within the request's deadline; this one only stops a hung run.
CALL_TIMEOUT_S = 300.0
DISK_EVERY_S = 0.5
PICK_SEED = 11


@dataclass(frozen=True)
class TiersScale(Windows):
    many: int = 2000
    few: int = 20
    head: int = 32  # adapters of the small Zipf arm
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
QUICK = TiersScale(many=400, repeats=2, cold=10, concurrency=16, max_tokens=8)


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
    section: Section,
    replica: Replica,
    gen: LoadGenerator,
    arms: dict[str, list[str]],
    scale: TiersScale,
) -> tuple[Runs, dict[str, list[float]], int, list[float]]:
    """Figure 5's windows: the arms interleaved, order rotated, the small arm twice (the
    noise). Returns them, the downloads during each, the peak of the cache's bytes
    sampled meanwhile, and the replica's RSS after each repeat's many-adapter arm."""
    head = arms[list(arms)[-1]]
    await warm_up(replica.address, tuple(head))
    template = Workload(
        adapters=(),
        concurrency=scale.concurrency,
        requests=max(scale.requests, 1024),
        max_tokens=scale.max_tokens,
        popularity=f"zipf:{scale.zipf}",
    )
    loads = [
        closed(
            arm,
            Target("grpc", replica.address),
            dataclasses.replace(template, adapters=tuple(names)),
            scale.concurrency,
            replica.child.process.pid,
        )
        for arm, names in arms.items()
    ]
    section.workload += [arm.describe() for arm in loads]
    section.workload.append(
        f"Zipf arms: {scale.repeats} repeats, order rotated, {scale.timing.describe()}; the "
        f"{len(head)} head adapters warmed first (two requests each)"
    )
    stop, peak = asyncio.Event(), [0]
    watcher = asyncio.create_task(_watch_disk(replica.cache_dir, stop, peak))
    downloads: dict[str, list[float]] = {}
    rss_after: list[float] = []
    many = next(iter(arms))

    @contextlib.asynccontextmanager
    async def counted(arm: str) -> AsyncIterator[None]:
        before = await replica.downloads()
        yield
        downloads.setdefault(arm, []).append(await replica.downloads() - before)
        if arm == many:
            rss_after.append(replica.rss_mib())

    try:
        runs = await paired(
            gen, loads, scale.timing, scale.repeats, noise=list(arms)[-1], around=counted
        )
    finally:
        stop.set()
        await watcher
    return runs, downloads, peak[0], rss_after


async def _seeded(section: Section, stack: Stack, scale: TiersScale) -> tuple[Rig, list[str], int]:
    """Both stores seeded; the rig, the many store's names, and the cache bound."""
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
    return rig, names, bound


async def _measure(section: Section, stack: Stack, gen: LoadGenerator, scale: TiersScale) -> None:
    rig, names, bound = await _seeded(section, stack, scale)
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
    rss_goal(section, few, many)
    picks = random.Random(PICK_SEED).sample(names[scale.head :], scale.cold + 1)
    async with _client(replica.address) as client:
        call = grpc_caller(client)
        # Connects the channel before any request is timed.
        await stream_into(Record("", time.monotonic()), call, PROMPT, 1)
        await _cold_and_warm(section, replica, call, picks[:-1])
        await _singleflight(section, replica, call, picks[-1], scale.concurrent)
    arms = {f"Zipf over {scale.many:,}": names, f"Zipf over {scale.head}": names[: scale.head]}
    runs, downloads, peak, rss_after = await _traffic(section, replica, gen, arms, scale)
    samples = await replica.samples()
    disk_figures(
        section,
        disk=await asyncio.to_thread(disk_use, replica.cache_dir),
        gauge=metric_value(samples, CACHE_BYTES),
        peak=peak,
        bound=bound,
    )
    throughput_figures(section, runs, downloads, *arms)
    host = metric_value(samples, "loraserve_inference_adapter_tier_adapters", tier="host")
    rss_after_figures(section, starts["many"][-1].rss_mib, rss_after, host)
    tier_table(section, samples)


async def run(report: Report, *, quick: bool, engine: str = "cpu") -> None:
    """Benchmark 11."""
    scale = QUICK if quick else TiersScale()
    section = report.section(
        NUMBER, f"Thousands of adapters per replica: {scale.many:,} vs {scale.few} in the store"
    )
    if quick:
        section.workload.append("smoke run (--quick): fewer adapters, two repeats")
    stack = Stack(
        report.results_dir, Path(tempfile.mkdtemp(prefix="bench-tiers-")), PROFILES[engine]
    )
    gen = LoadGenerator(stack.logs)
    started = time.monotonic()
    try:
        await gen.start()
        await _measure(section, stack, gen, scale)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        section.seconds = time.monotonic() - started
        report.print_section(section)
        await gen.close()
        await stack.close()
