"""Benchmarks 1-3: closed-loop throughput and time-to-first-token, arms side by side.

1. gRPC overhead: Generate over gRPC vs the same engine called in-process.
2. Batching many adapters: max_loras 8 vs 1 (engines A and B), and adapters vs base.
3. More adapters than slots: 32 adapters over 8 slots, uniform and Zipf, vs 8 over 8,
   and 32 over 32 slots (`--max-loras 32`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bench.probes import CpuMeter, LoadSampler
from bench.procs import EngineConfig
from bench.report import Report, Section
from bench.runs import Arm, Scale, grpc_arm, host_arm, interleaved
from bench.stack import ENGINE_A, ENGINE_B, ENGINE_C, Stack, model_description, tenant
from bench.stats import median, ratio
from bench.workload import RunResult, Workload

Results = dict[str, list[RunResult]]
RAISED = "32 uniform, --max-loras 32 (engine C)"


def tps(results: Results, arm: str) -> float:
    return median([r.tokens_per_s for r in results[arm]])


def ttft(results: Results, arm: str, q: float, adapters: set[str] | None = None) -> float:
    return median([r.ttft_p(q, adapters) for r in results[arm]]) * 1000


def arm_rows(results: Results) -> list[list[str | int | float]]:
    return [
        [
            arm,
            tps(results, arm),
            min(r.tokens_per_s for r in runs),
            max(r.tokens_per_s for r in runs),
            ttft(results, arm, 50),
            ttft(results, arm, 99),
        ]
        for arm, runs in results.items()
    ]


HEADERS = ["arm", "tok/s (median)", "min", "max", "TTFT p50 ms", "TTFT p99 ms"]


def bar_plot(report: Report, section: Section, results: Results, name: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 3.6))
    arms = list(results)
    axes.barh(arms, [tps(results, arm) for arm in arms])
    axes.invert_yaxis()
    axes.set_xlabel("tokens/s (median over repeats)")
    axes.set_title(title)
    report.save_figure(section, name, figure)
    plt.close(figure)


def engine_line(stack: Stack, name: str, engine: EngineConfig) -> str:
    if stack.profile.name == "cpu":
        where = "vLLM CPU build, KV cache 1 GiB"
    else:
        where = f"CUDA vLLM, gpu_memory_utilization {stack.profile.gpu_memory_utilization}"
    return (
        f"engine {name}: {where}, max_loras {engine.max_loras}, max_cpu_loras "
        f"{engine.max_cpu_loras}, max_lora_rank {engine.max_lora_rank}, enforce_eager; "
        + model_description()
    )


def eight_and_base(scale: Scale) -> tuple[Workload, Workload]:
    """Benchmarks 1, 2 and 8's closed loops: over the first 8 adapters, and the same on
    the base model."""
    adapters = Workload(
        adapters=tuple(tenant(i) for i in range(8)),
        concurrency=scale.concurrency,
        requests=scale.concurrency,
        max_tokens=scale.max_tokens,
    )
    return adapters, dataclasses.replace(adapters, adapters=("",))


async def overhead(report: Report, stack: Stack, scale: Scale) -> Results:
    """Benchmark 1; returns its results (its gRPC arm is benchmark 2's max_loras=8 arm)."""
    section = report.section(1, "gRPC overhead: Generate vs the same engine in-process")
    started = time.monotonic()
    assert stack.host is not None
    workload, _ = eight_and_base(scale)
    section.workload += [
        workload.describe(),
        engine_line(stack, "A", ENGINE_A),
        f"{scale.repeats} repeats, arm order rotated each repeat; medians reported",
        "arms: vllm-direct = VllmEngine.generate (AsyncLLM) in the server process; "
        "generator = the service's Generator (validation, admission, adapter lease) "
        "in-process; grpc = Generate through the client library from another process, "
        "same server process and engine",
    ]
    cpu: dict[str, list[dict[str, float]]] = {}

    @asynccontextmanager
    async def metered(arm: str) -> AsyncIterator[None]:
        assert stack.host is not None
        meter = CpuMeter(stack.host.child.process.pid)
        async with meter.measure():
            yield
        cpu.setdefault(arm, []).append(meter.used)

    results = await interleaved(
        {
            "vllm-direct": (host_arm(stack.host, "direct"), workload),
            "generator": (host_arm(stack.host, "generator"), workload),
            "grpc": (grpc_arm(stack.host.child.address), workload),
        },
        scale.repeats,
        metered,
    )
    section.table("Throughput and TTFT", HEADERS, arm_rows(results))
    section.record_repeats(results)
    _cpu_table(section, cpu, workload.requests * workload.max_tokens / 1000)
    _overhead_goals(section, results)
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return results


def _cpu_table(section: Section, cpu: dict[str, list[dict[str, float]]], tokens: float) -> None:
    """CPU seconds per 1000 tokens (`tokens`: thousands per run) by process and arm."""
    roles = sorted({role for runs in cpu.values() for used in runs for role in used})
    section.table(
        "CPU seconds per 1000 tokens by process (median over repeats; 2 cores in all, vLLM "
        "binds its worker to core 0 and leaves core 1 to everything else)",
        ["arm", *roles],
        [
            [arm, *(median([u.get(role, 0.0) for u in runs]) / tokens for role in roles)]
            for arm, runs in cpu.items()
        ],
    )


def _overhead_goals(section: Section, results: Results) -> None:
    tps_ratio = ratio(tps(results, "grpc"), tps(results, "vllm-direct"))
    added_ttft = ttft(results, "grpc", 50) - ttft(results, "vllm-direct", 50)
    section.goal(
        "gRPC tok/s / in-process tok/s", tps_ratio, ">= 0.95 (push 0.99)", tps_ratio >= 0.95, ".3f"
    )
    section.goal("added TTFT p50 over gRPC (ms)", added_ttft, "reported", None, ".1f")
    gen_ratio = ratio(tps(results, "generator"), tps(results, "vllm-direct"))
    section.goal("Generator in-process tok/s / vLLM direct", gen_ratio, "reported", None, ".3f")


async def batching(report: Report, stack: Stack, scale: Scale) -> Results:
    """Benchmark 2: max_loras 8 (A) vs 1 (B), and 8 adapters vs the base model (A)."""
    section = report.section(2, "Batching many adapters: max_loras 8 vs 1, adapters vs base")
    started = time.monotonic()
    assert stack.host is not None
    assert stack.engine_b is not None
    adapters, base = eight_and_base(scale)
    section.workload += [
        "adapters: " + adapters.describe(),
        "base: " + base.describe(),
        engine_line(stack, "A", ENGINE_A),
        engine_line(stack, "B", ENGINE_B),
        f"all arms over gRPC; both engines up the whole time; {scale.repeats} repeats, "
        "order rotated",
    ]
    results = await interleaved(
        {
            "A max_loras=8, 8 adapters": (grpc_arm(stack.host.child.address), adapters),
            "B max_loras=1, 8 adapters": (grpc_arm(stack.engine_b.address), adapters),
            "A base model only": (grpc_arm(stack.host.child.address), base),
        },
        scale.repeats,
    )
    section.table("Throughput and TTFT", HEADERS, arm_rows(results))
    section.record_repeats(results)
    bar_plot(report, section, results, "batching.png", "Throughput: slots and adapters vs base")
    slots = ratio(
        tps(results, "A max_loras=8, 8 adapters"), tps(results, "B max_loras=1, 8 adapters")
    )
    vs_base = ratio(tps(results, "A max_loras=8, 8 adapters"), tps(results, "A base model only"))
    section.goal(
        "max_loras 8 / max_loras 1 tok/s",
        slots,
        "keep vLLM's gain (~2.5x this model)",
        slots >= 2.0,
        ".2f",
    )
    section.goal("8 adapters / base model tok/s", vs_base, "reported (vLLM CPU ~0.45)", None, ".2f")
    section.notes.append(
        "vLLM's CPU LoRA path is plain PyTorch ops, so LoRA costs far more here than on a "
        "GPU; ENVIRONMENT.md's direct-vLLM probe on this model gave 2.5x (max_loras 8 vs 1) "
        "and 0.45x (adapters vs base)."
    )
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return results


async def slots(report: Report, stack: Stack, scale: Scale) -> Results:
    """Benchmark 3: 32 adapters over 8 slots (uniform, Zipf 1.5) vs 8 over 8."""
    section = report.section(3, "More adapters than slots: 32 over 8, uniform and Zipf(1.5)")
    started = time.monotonic()
    arms, served_by = _slot_arms(section, stack, scale)
    samplers: dict[str, LoadSampler] = {}

    @asynccontextmanager
    async def sampled(arm: str) -> AsyncIterator[None]:
        sampler = samplers.setdefault(arm, LoadSampler(served_by[arm]))
        async with sampler.sampling():
            yield

    results = await interleaved(arms, scale.repeats, sampled)
    section.table("Throughput and TTFT", HEADERS, arm_rows(results))
    section.record_repeats(results)
    bar_plot(report, section, results, "adapters_vs_slots.png", "Throughput vs adapters")
    section.table(
        "Requests in the engine while each arm ran (GetServerInfo every 100 ms, medians)",
        ["arm", "running (in the batch)", "waiting"],
        [[arm, *sampler.summary()] for arm, sampler in samplers.items()],
    )
    direct_ratio = ratio(
        tps(results, "32 uniform, vllm-direct"), tps(results, "8 / 8, vllm-direct")
    )
    section.notes.append(
        f"vLLM called directly on the same workloads: 32-uniform / 8-over-8 = {direct_ratio:.2f}. "
        "vLLM's scheduler already skips waiting requests whose adapter would exceed max_loras "
        "(no head-of-line blocking) and keeps every running request's adapter in its slot, so "
        "with 64 streams over 32 adapters only about a quarter of them can share a step: the "
        "loss is smaller batches, the same with or without the service in front."
    )
    rare_ratio = _zipf_table(section, results)
    _slot_goals(section, results, rare_ratio)
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return results


def _slot_arms(
    section: Section, stack: Stack, scale: Scale
) -> tuple[dict[str, tuple[Arm, Workload]], dict[str, str]]:
    """Benchmark 3's arms (engine C's when it is up), described in `section`, and the
    server address each arm's requests go to."""
    assert stack.host is not None
    eight = Workload(
        tuple(tenant(i) for i in range(8)),
        scale.concurrency,
        scale.slot_requests,
        scale.slot_tokens,
    )
    uniform = dataclasses.replace(eight, adapters=tuple(tenant(i) for i in range(32)))
    zipf = dataclasses.replace(uniform, popularity="zipf:1.5")
    section.workload += [
        "8/8: " + eight.describe(),
        "32/8 uniform: " + uniform.describe(),
        "32/8 zipf: " + zipf.describe(),
        engine_line(stack, "A", ENGINE_A),
        "popular = the 8 most likely adapters under Zipf, rare = the other 24; "
        f"over gRPC; {scale.repeats} repeats, order rotated",
    ]
    address = stack.host.child.address
    arms = {
        "8 adapters / 8 slots": (grpc_arm(address), eight),
        "32 adapters uniform": (grpc_arm(address), uniform),
        "32 adapters zipf 1.5": (grpc_arm(address), zipf),
        "32 uniform, vllm-direct": (host_arm(stack.host, "direct"), uniform),
        "8 / 8, vllm-direct": (host_arm(stack.host, "direct"), eight),
    }
    served_by = dict.fromkeys(arms, address)
    if stack.engine_c is not None:
        arms[RAISED] = (grpc_arm(stack.engine_c.address), uniform)
        served_by[RAISED] = stack.engine_c.address
        section.workload.append(f"{RAISED}: " + engine_line(stack, "C", ENGINE_C))
    return arms, served_by


def _zipf_table(section: Section, results: Results) -> float:
    """TTFT of the Zipf arm's popular vs rare adapters; returns rare / popular p99."""
    popular = {tenant(i) for i in range(8)}
    rare = {tenant(i) for i in range(8, 32)}
    zipf_runs = results["32 adapters zipf 1.5"]
    rare_count = sum(len(r.ttfts(rare)) for r in zipf_runs)
    p99_pop = ttft(results, "32 adapters zipf 1.5", 99, popular)
    p99_rare = ttft(results, "32 adapters zipf 1.5", 99, rare)
    section.table(
        "Zipf(1.5): TTFT of popular vs rare adapters (ms, median over repeats)",
        ["group", "requests (all repeats)", "p50", "p99"],
        [
            [
                "popular (top 8)",
                sum(len(r.ttfts(popular)) for r in zipf_runs),
                ttft(results, "32 adapters zipf 1.5", 50, popular),
                p99_pop,
            ],
            [
                "rare (other 24)",
                rare_count,
                ttft(results, "32 adapters zipf 1.5", 50, rare),
                p99_rare,
            ],
        ],
    )
    return ratio(p99_rare, p99_pop)


def _slot_goals(section: Section, results: Results, rare_ratio: float) -> None:
    base = tps(results, "8 adapters / 8 slots")
    for arm in ("32 adapters uniform", "32 adapters zipf 1.5"):
        value = ratio(tps(results, arm), base)
        section.goal(f"{arm} / 8-over-8 tok/s", value, ">= 0.85", value >= 0.85, ".2f")
    if RAISED in results:
        raised = ratio(tps(results, RAISED), base)
        section.goal(
            "32 uniform with --max-loras 32 / 8-over-8 tok/s", raised, "reported", None, ".2f"
        )
    section.goal("Zipf rare / popular TTFT p99", rare_ratio, "<= 1.5", rare_ratio <= 1.5, ".2f")
