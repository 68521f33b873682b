"""The `--profile real` benchmarks, on the locally built Llama-shaped base and rank-64
adapters of bench.real.models (~73 MB each):

14. store push and download of those adapters vs boto3 on the same S3 (bench.store.transfers);
15. a fleet cold start: 16 replica caches vs 16 boto3 readers (bench.real.fleet_caches);
16. cold first request: push -> first token of an adapter nothing cached, vs vLLM's
    load_lora_adapter of the same file under a new name (bench.swap.arms, cold);
17. hot swap of a loaded adapter vs vLLM's load_inplace (bench.swap.arms, hot);
18. a load's effect on running streams (bench.real.load_stall).

Each group runs on its own store and servers, one engine group at a time.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.load.drive import Windows
from bench.load.loadclient import LoadGenerator
from bench.load.workload import Workload
from bench.method.gpu import Budget, Limit
from bench.method.report import Report, Section
from bench.method.runs import warm_up
from bench.real import fleet_caches, load_stall, models
from bench.rig import procs, storeops
from bench.rig.procs import EngineConfig
from bench.rig.stack import BUCKET, PROFILES, Stack
from bench.rig.variants import write_variant
from bench.store import transfers
from bench.swap import vs_vllm
from bench.swap.arms import Servers, rounds
from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.testing.otlp import otlp_receiver
from loraserve.testing.processes.services import free_port

ENGINE = EngineConfig(max_loras=4, max_cpu_loras=8, max_lora_rank=models.RANK)
ADAPTERS = 10


@dataclass(frozen=True)
class RealScale(Windows):
    swaps: int = 6
    fleet_processes: int = 16
    fleet_adapters: int = 8
    streams: int = 16
    max_tokens: int = 16
    # Never-loaded adapters pushed for 18 before it starts (the same bytes under new
    # names, every one downloaded and loaded); topped up between windows as loads use them.
    cold_names: int = 120
    # The streams' first requests spread over the warm-up, and with equal lengths they
    # keep that spacing. A request lives about 17 s on the 2-core CPU engine: spread over
    # 5 s, the 16 arrive as a wave, and vLLM's AsyncLLM alone (no service) then stalls
    # running streams for up to 12 s with nothing loading (TTFT p50 15 s), against 2.5 s
    # (TTFT 2.4 s) spread over 24 s.
    warmup_s: float = 24.0
    window_s: float = 30.0


QUICK = RealScale(
    repeats=2,
    swaps=2,
    fleet_processes=4,
    fleet_adapters=2,
    warmup_s=3.0,
    window_s=10.0,
    cold_names=30,
)
GPU = replace(RealScale(), warmup_s=1.0, window_s=4.0, cold_names=60)
PUSHES_AT_ONCE = 4


def _stack(report: Report, engine: str) -> Stack:
    stack = Stack(
        report.results_dir, Path(tempfile.mkdtemp(prefix="bench-real-")), PROFILES[engine]
    )
    stack.model_dir = models.build_model()
    built = models.build_adapters(ADAPTERS)
    stack.adapters.update(built)
    stack.adapters["swap-v0"] = built["r00"]
    return stack


def _describe(section: Section, *lines: str) -> None:
    section.workload += [models.describe(), *lines]


async def _store_benchmarks(
    report: Report, wanted: set[int], scale: RealScale, engine: str
) -> None:
    """14 and 15, on one store (no engine)."""
    stack = _stack(report, engine)
    try:
        await stack.start_store()
        if 14 in wanted:
            await _transfers(report, stack, scale)
        if 15 in wanted:
            await _fleet(report, stack, scale)
    finally:
        await stack.close()


async def _transfers(report: Report, stack: Stack, scale: RealScale) -> None:
    section = report.section(14, "Store transfers of real-size adapters vs boto3")
    started = time.monotonic()
    source = stack.adapters["r00"]

    async def write(rep: int, directory: Path) -> Path:
        return await asyncio.to_thread(write_variant, source, directory, 5000 + rep)

    assert stack.store is not None
    rig = transfers.Rig(stack.store, procs.s3_client(stack.store_endpoint), BUCKET, stack.work)
    measured = await transfers.measure(rig, scale.repeats, write)
    _describe(
        section,
        f"one real adapter ({measured.megabytes:.0f} MB), new bytes every repeat, "
        f"{scale.repeats} repeats, arms rotated (bench.store.transfers)",
    )
    transfers.figures(section, measured, rss_check=False)
    section.seconds = time.monotonic() - started
    report.print_section(section)


async def _fleet(report: Report, stack: Stack, scale: RealScale) -> None:
    section = report.section(15, "Fleet cold start: replica caches vs boto3 on one S3")
    started = time.monotonic()
    assert stack.store_channel is not None
    assert stack.store is not None
    stub = storeops.store_stub(stack.store_channel)
    refs: list[str] = []
    keys: list[str] = []
    for i in range(scale.fleet_adapters):
        files = await storeops.hashed(stack.adapters[f"r{i:02d}"])
        revision = await storeops.push(stub, f"fleet-{i}", files)
        refs.append(f"fleet-{i}@{revision}")
        keys += fleet_caches.blob_keys([(f.name, f.sha256) for f in files.files])
    fleet = fleet_caches.Fleet(
        stack.store, stack.store_endpoint, BUCKET, tuple(refs), tuple(keys), scale.fleet_processes
    )
    measured = await fleet_caches.measure(fleet, scale.repeats, stack.logs)
    _describe(
        section,
        f"{scale.fleet_processes} processes at once, each fetching the same "
        f"{scale.fleet_adapters} adapters: the inference service's AdapterCache through "
        "the store, or one streamed get_object per blob from moto; each process ready "
        f"before the go; {scale.repeats} repeats, arms rotated, boto3 twice (the noise)",
    )
    fleet_caches.figures(section, fleet, measured)
    section.seconds = time.monotonic() - started
    report.print_section(section)


async def _swaps(
    report: Report, wanted: set[int], scale: RealScale, engine: str, limit: Limit
) -> None:
    """16 and 17 on loraserve and vllm serve, both on the real base (their start is a
    phase of its own on a GPU)."""
    stack = _stack(report, engine)
    try:
        servers: Servers | None = None
        async with otlp_receiver() as otlp:
            async with limit(report, 16 if 16 in wanted else 17, phase="real servers"):
                servers = await vs_vllm.start_servers(stack, ENGINE, otlp)
            if servers is None:
                return
            for number, cold in ((16, True), (17, False)):
                if number in wanted:
                    async with limit(report, number):
                        await _swap(report, servers, number, cold, scale)
    finally:
        await stack.close()


async def _swap(
    report: Report, servers: Servers, number: int, cold: bool, scale: RealScale
) -> None:
    title = (
        "Cold first request: push -> first token vs vLLM load_lora_adapter"
        if cold
        else "Hot swap of a loaded adapter: push vs vLLM load_inplace"
    )
    section = report.section(number, title)
    started = time.monotonic()
    swaps, startup = await rounds(servers, scale.swaps, cold=cold)
    kind = "a new adapter name per swap" if cold else "new revisions of one loaded adapter"
    _describe(
        section,
        f"{scale.swaps} rounds, the arms in each of their six orders in turn, new weights "
        f"each round (a variant of a built adapter); {kind}; "
        f"engine: max_loras {ENGINE.max_loras}, "
        f"max_cpu_loras {ENGINE.max_cpu_loras}, fp32 (measured faster than bf16 on "
        "this CPU build), eager",
        vs_vllm.SERVING,
        vs_vllm.TRACED,
        vs_vllm.BARE_PATH,
    )
    vs_vllm.figures(section, swaps, startup, None)
    section.seconds = time.monotonic() - started
    report.print_section(section)


def stall_argv(stack: Stack, port: int) -> list[str]:
    """Benchmark 18's replica: nothing loads before its first request; the cache bounded
    (every load writes another copy of the same bytes)."""
    return [
        *stack.argv("replica", port, ENGINE),
        "--prefetch-adapters=0",
        f"--adapter-cache-size={2 * 2**30}",
    ]


class ColdPool:
    """Never-loaded adapters for 18: the same bytes, hashed once, pushed under new names."""

    def __init__(self, stub: Any, files: AdapterFiles) -> None:
        self._stub, self._files = stub, files
        self._pushed = 0

    async def push(self, count: int) -> list[str]:
        names = [f"cold-{i:04d}" for i in range(self._pushed, self._pushed + count)]
        self._pushed += count
        limit = asyncio.Semaphore(PUSHES_AT_ONCE)

        async def push(name: str) -> None:
            async with limit:
                await storeops.push(self._stub, name, self._files)

        await asyncio.gather(*(push(name) for name in names))
        return names


async def _stall_replica(
    stack: Stack, scale: RealScale
) -> tuple[procs.Child, load_stall.NeverLoaded]:
    """The store with the streams' two adapters and `cold_names` never-loaded ones, and
    a SERVING replica that has loaded the two; returns it and the never-loaded ones."""
    await stack.start_store()
    for name, source in (("s0", "r00"), ("s1", "r01")):
        await stack.push(name, source)
    assert stack.store_channel is not None
    stub = storeops.store_stub(stack.store_channel)
    pool = ColdPool(stub, await storeops.hashed(stack.adapters["r02"]))
    cold = load_stall.NeverLoaded(await pool.push(scale.cold_names), pool.push)
    port = free_port()
    replica = procs.start_inference(
        stack.logs, "replica", stall_argv(stack, port), f"127.0.0.1:{port}", stack.profile.env
    )
    stack.children.append(replica)
    await procs.wait_serving(replica, stack.logs, 900)
    await warm_up(replica.address, ("s0", "s1"))
    return replica, cold


async def _stall(report: Report, scale: RealScale, engine: str) -> None:
    """18 on one replica that loads nothing until asked (--prefetch-adapters 0)."""
    section = report.section(18, "A load's effect on running streams (real-size adapters)")
    started = time.monotonic()
    stack = _stack(report, engine)
    gen = LoadGenerator(stack.logs)
    try:
        await gen.start()
        replica, cold = await _stall_replica(stack, scale)
        streams = Workload(("s0", "s1"), scale.streams, 256, scale.max_tokens)
        measured = await load_stall.measure(
            gen,
            replica.address,
            replica.process.pid,
            streams,
            cold,
            scale.timing,
            scale.repeats,
        )
        _describe(
            section,
            f"replica: max_loras {ENGINE.max_loras}, max_cpu_loras {ENGINE.max_cpu_loras}, "
            "--prefetch-adapters 0 (nothing loads before its first request), fp32",
            f"streams: closed loop of {scale.streams} over 2 loaded adapters, "
            f"{scale.max_tokens} output tokens each; {scale.repeats} repeats of "
            f"{scale.timing.describe()}, arms rotated, no-loads twice (the noise)",
            "loads: one-token first requests to never-loaded adapters (same bytes under new "
            "names: every one downloaded, checked and loaded), one after another",
        )
        load_stall.figures(section, measured)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        section.seconds = time.monotonic() - started
        report.print_section(section)
        await gen.close()
        await stack.close()


async def run(
    report: Report, wanted: set[int], *, quick: bool, engine: str, budget: Budget
) -> None:
    scale = QUICK if quick else GPU if engine == "gpu" else RealScale()
    if wanted & {14, 15}:
        await _store_benchmarks(report, wanted, scale, engine)
    if wanted & {16, 17}:
        await _swaps(report, wanted, scale, engine, budget.limit)
    if 18 in wanted:
        async with budget.limit(report, 18):
            await _stall(report, scale, engine)
