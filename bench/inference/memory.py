"""Benchmark 7: one engine + N adapters vs N engines. Memory for one more tenant as an
adapter (engine A's growth from 8 to 32 loaded adapters) vs as an engine (engine B, a
whole `inference serve`), and throughput per GB with two tenants either way."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from bench.load.drive import Load
from bench.load.loadclient import Arm, LoadGenerator
from bench.load.targets import Target
from bench.method import paired
from bench.method.paired import Runs
from bench.method.report import Report, Section
from bench.method.runs import Scale, closed, schedule_for
from bench.method.stats import median, median_interval
from bench.rig.stack import ENGINE_A, ENGINE_B, Stack, tenant, wait_routed

GIB = 1024.0


@dataclass
class EngineMemory:
    a8_rss: float
    a8_uss: float
    b_rss: float
    b_uss: float
    runs: Runs | None = None
    arms: list[str] = field(default_factory=list)
    seconds: float = 0.0


ONE = "1 engine, 2 tenants as adapters"
TWO = "2 engines, 1 tenant each"


# Engine A grows from 8 to 32 adapters in steps of this many, each step measured alone.
STEP = 8
STEPS = 3
SAMPLES = 5
SAMPLE_GAP_S = 0.2


@dataclass
class AdapterGrowth:
    """Engine A's memory as adapters were added with nothing else running."""

    before: tuple[float, float]  # (RSS, USS) MiB with 8 adapters
    after: tuple[float, float]  # with 8 + STEP * STEPS
    per_adapter_uss: list[float] = field(default_factory=list)  # one per step
    per_adapter_rss: list[float] = field(default_factory=list)


async def _settled_memory(stack: Stack) -> tuple[float, float]:
    """Median (RSS, USS) of engine A over a few samples of the idle server."""
    assert stack.host is not None
    samples = []
    for _ in range(SAMPLES):
        samples.append(await asyncio.to_thread(stack.host.child.memory))
        await asyncio.sleep(SAMPLE_GAP_S)
    return median([r for r, _ in samples]), median([u for _, u in samples])


async def grow_adapters(stack: Stack) -> AdapterGrowth:
    """Pushes tenants 8..31 to engine A in steps, memory sampled before and after each
    step once its adapters are loaded and routed; no request runs in between, so the
    difference is the adapters' alone. Each step is one repeat of the per-adapter cost."""
    assert stack.host is not None
    first = current = await _settled_memory(stack)
    growth = AdapterGrowth(first, first)
    for step in range(STEPS):
        names = [tenant(8 + step * STEP + i) for i in range(STEP)]
        pushed = {name: await stack.push(name) for name in names}
        await wait_routed(stack.host.child.address, pushed)
        after = await _settled_memory(stack)
        growth.per_adapter_rss.append((after[0] - current[0]) / STEP)
        growth.per_adapter_uss.append((after[1] - current[1]) / STEP)
        current = after
    growth.after = current
    return growth


async def engines(stack: Stack, gen: LoadGenerator, scale: Scale) -> EngineMemory:
    """The part that needs both engines up; reported later with report_memory()."""
    started = time.monotonic()
    host, engine_b = stack.host, stack.engine_b
    assert host is not None
    assert engine_b is not None
    a_rss, a_uss = host.child.memory()
    b_rss, b_uss = engine_b.memory()
    result = EngineMemory(a_rss, a_uss, b_rss, b_uss)
    both = schedule_for((tenant(0), tenant(1)), scale)
    routes = f"{tenant(0)}={host.child.address};{tenant(1)}={engine_b.address}"
    one = closed(ONE, Target("grpc", host.child.address), both, scale.concurrency, host.pid)
    two = Arm(
        TWO,
        Target("grpc_routes", routes),
        both,
        Load("closed", concurrency=scale.concurrency),
        (("front", host.pid), ("front_1", engine_b.process.pid)),
    )
    result.arms = [one.describe(), two.describe() + f" ({tenant(0)} on A, {tenant(1)} on B)"]
    result.runs = await paired.paired(gen, [one, two], scale.timing, scale.repeats, noise=ONE)
    result.seconds = time.monotonic() - started
    return result


async def report_memory(
    report: Report, stack: Stack, measured: EngineMemory, growth: AdapterGrowth
) -> None:
    """Engine A now holds 32 adapters: finish benchmark 7 and report it."""
    section = report.section(7, "One engine + N adapters vs N engines")
    started = time.monotonic()
    section.workload += _workload_lines(measured, growth)
    per_adapter = median(growth.per_adapter_uss)
    file_mib = (
        stack.adapters[tenant(0)].joinpath("adapter_model.safetensors").stat().st_size / 2**20
    )
    section.table(
        "Memory (MiB)",
        ["what", "RSS", "USS"],
        [
            ["engine A, 8 adapters loaded (idle)", *growth.before],
            ["engine A, 32 adapters loaded (idle)", *growth.after],
            ["engine B (one more engine), 1 slot", measured.b_rss, measured.b_uss],
            [
                "per extra adapter (median of the steps)",
                median(growth.per_adapter_rss),
                per_adapter,
            ],
            ["adapter file on disk (safetensors, fp32)", file_mib, file_mib],
        ],
    )
    assert measured.runs is not None
    runs = measured.runs
    paired.arm_table(section, runs)
    _per_gib_tables(section, measured, per_adapter)
    _record(section, growth)
    section.reported(
        "memory per extra tenant as adapter (MiB, USS; steps of 8)",
        median_interval(growth.per_adapter_uss),
        ".1f",
    )
    section.reported(
        "memory per extra tenant as engine (MiB, USS; one sample)", measured.b_uss, ".0f"
    )
    section.reported(
        "tok/s, 2 tenants: 1 engine / 2 engines", runs.ratio(ONE, TWO, "tokens_per_s"), ".2f"
    )
    paired.close(section, runs, ("tokens_per_s",))
    section.notes.append(
        "Extrapolation is linear from what was measured (1 and 2 engines; 8 and 32 adapters); "
        "N engines on one machine also split the same cores, so their aggregate tok/s does "
        "not grow with N, while each keeps its own KV cache (1 GiB here)."
    )
    section.seconds = measured.seconds + time.monotonic() - started
    report.print_section(section)


def _workload_lines(measured: EngineMemory, growth: AdapterGrowth) -> list[str]:
    return [
        *measured.arms,
        f"engine A: max_loras {ENGINE_A.max_loras}, max_cpu_loras {ENGINE_A.max_cpu_loras}; "
        f"engine B (one tenant's engine): max_loras {ENGINE_B.max_loras}; both vLLM CPU, "
        "KV cache 1 GiB, fp32; memory = RSS / USS summed over the server process and its "
        "vLLM engine-core child (USS: pages no other process shares, i.e. what one more costs)",
        f"per-adapter memory: {STEPS * STEP} adapters pushed to idle engine A in {STEPS} "
        f"steps of {STEP}; before and after each step (once its adapters were loaded and "
        f"routed, no request run) the median of {SAMPLES} samples; per adapter = the "
        "median over the steps of (after - before) / "
        f"{STEP}; every step: "
        + ", ".join(f"{u:.1f}" for u in growth.per_adapter_uss)
        + " MiB USS",
    ]


def _per_gib_tables(section: Section, measured: EngineMemory, per_adapter: float) -> None:
    """Two tenants' throughput per GiB either way, and N tenants extrapolated."""
    assert measured.runs is not None
    one_tps = measured.runs.estimate(ONE, "tokens_per_s").value
    two_tps = measured.runs.estimate(TWO, "tokens_per_s").value
    one_gb = measured.a8_rss / GIB
    two_gb = (measured.a8_rss + measured.b_uss) / GIB
    section.table(
        "Two tenants: throughput per GiB (median tok/s over repeats)",
        ["layout", "tok/s", "memory GiB", "tok/s per GiB"],
        [
            [ONE, one_tps, one_gb, one_tps / one_gb],
            [TWO + " (A RSS + B USS)", two_tps, two_gb, two_tps / two_gb],
        ],
    )
    rows: list[list[str | int | float]] = []
    for n in (8, 32, 100):
        as_adapters = measured.a8_rss + (n - 8) * max(per_adapter, 0.0)
        as_engines = measured.a8_rss + (n - 1) * measured.b_uss
        rows.append([n, as_adapters / GIB, as_engines / GIB, as_engines / as_adapters])
    section.table(
        "Extrapolated memory for N tenants (GiB): one engine + N adapters vs N engines",
        ["N", "1 engine + N adapters", "N engines", "ratio"],
        rows,
    )


def _record(section: Section, growth: AdapterGrowth) -> None:
    """Every step of adapters in results.json."""
    section.record(
        "per extra adapter (one step of 8)",
        [
            {"rss_mib": rss, "uss_mib": uss}
            for rss, uss in zip(growth.per_adapter_rss, growth.per_adapter_uss, strict=True)
        ],
    )
