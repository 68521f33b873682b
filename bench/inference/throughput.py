"""Benchmarks 1-3: steady-state throughput and latency, arms side by side.

1. gRPC overhead: Generate over gRPC vs the same engine driven through the thinnest
   path (bench.load.thin: VllmEngine alone, or the service's Generator), the load
   generator in its own process for every arm.
2. Batching many adapters: max_loras 8 vs 1 through loraserve (engines A and B) and
   through vLLM alone (A's engine direct, a raw AsyncLLM with B's flags), and adapters
   vs base.
3. More adapters than slots: 32 adapters over 8 slots, uniform and Zipf, vs 8 over 8,
   and 32 over 32 slots (`--max-loras 32`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bench.load.loadclient import Arm, LoadGenerator
from bench.load.targets import Target
from bench.method import paired
from bench.method.paired import Runs
from bench.method.probes import LoadSampler
from bench.method.report import Report, Section
from bench.method.runs import Scale, closed, schedule_for
from bench.method.stats import paired_difference, paired_ratio
from bench.rig.procs import EngineConfig
from bench.rig.stack import ENGINE_A, ENGINE_B, ENGINE_C, Host, Stack, model_description, tenant

RAISED = "32 uniform, --max-loras 32 (engine C)"
EIGHT = tuple(tenant(i) for i in range(8))


def engine_line(stack: Stack, name: str, engine: EngineConfig) -> str:
    if stack.profile.gpu_memory_utilization is None:
        where = "vLLM CPU build, KV cache 1 GiB"
    else:
        where = f"CUDA vLLM, gpu_memory_utilization {stack.profile.gpu_memory_utilization}"
    return (
        f"engine {name}: {where}, max_loras {engine.max_loras}, max_cpu_loras "
        f"{engine.max_cpu_loras}, max_lora_rank {engine.max_lora_rank}, enforce_eager; "
        + model_description()
    )


def grpc_target(address: str) -> Target:
    return Target("grpc", address)


def _describe(section: Section, arms: list[Arm], scale: Scale) -> None:
    section.workload += [arm.describe() for arm in arms]
    section.workload.append(
        scale.describe() + "; the load generator runs in its own process (bench.load.loadgen)"
    )


async def overhead(report: Report, stack: Stack, gen: LoadGenerator, scale: Scale) -> Runs:
    """Benchmark 1."""
    section = report.section(1, "gRPC overhead: Generate vs the same engine without the service")
    started = time.monotonic()
    host = stack.host
    assert host is not None
    work = schedule_for(EIGHT, scale)
    arms = [
        closed(
            "engine direct", Target("thin", host.thin("direct")), work, scale.concurrency, host.pid
        ),
        closed(
            "Generator", Target("thin", host.thin("generator")), work, scale.concurrency, host.pid
        ),
        closed("gRPC", grpc_target(host.child.address), work, scale.concurrency, host.pid),
    ]
    _describe(section, arms, scale)
    section.workload += [
        engine_line(stack, "A", ENGINE_A),
        "engine direct = VllmEngine.generate (vLLM's AsyncLLM) in the server process, "
        "driven through bench.load.thin (a line per delta over loopback TCP); Generator = the "
        "service's Generator (validation, admission, adapter lease) the same way; gRPC = "
        "Generate through InferenceClient; one server process and engine for all three",
    ]
    runs = await paired.paired(gen, arms, scale.timing, scale.repeats, noise="gRPC")
    paired.arm_table(section, runs)
    paired.ratio_goal(
        section,
        runs,
        "gRPC tok/s / engine direct tok/s",
        ("gRPC", "engine direct"),
        "tokens_per_s",
        ">=",
        0.95,
    )
    added = paired_difference(
        runs.values("gRPC", "ttft_p50_ms"), runs.values("engine direct", "ttft_p50_ms")
    )
    section.reported("added TTFT p50 over gRPC (ms)", added, ".1f")
    section.reported(
        "Generator tok/s / engine direct tok/s",
        runs.ratio("Generator", "engine direct", "tokens_per_s"),
        ".3f",
    )
    section.reported(
        "server process CPU per token, gRPC / engine direct",
        runs.ratio("gRPC", "engine direct", "front_cpu_ms_per_1k"),
        ".2f",
    )
    paired.close(section, runs, ("tokens_per_s",))
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return runs


async def batching(
    report: Report, stack: Stack, gen: LoadGenerator, scale: Scale, raw_b: Host | None
) -> Runs:
    """Benchmark 2; `raw_b`: vLLM's AsyncLLM with engine B's flags (None: it did not start)."""
    section = report.section(2, "Batching many adapters: max_loras 8 vs 1, adapters vs base")
    started = time.monotonic()
    host, engine_b = stack.host, stack.engine_b
    assert host is not None
    assert engine_b is not None
    adapters = schedule_for(EIGHT, scale)
    base = schedule_for(("",), scale)
    c = scale.concurrency
    arms = [
        closed("A max_loras=8", grpc_target(host.child.address), adapters, c, host.pid),
        closed("B max_loras=1", grpc_target(engine_b.address), adapters, c, engine_b.process.pid),
        closed("A base model", grpc_target(host.child.address), base, c, host.pid),
        closed("vLLM max_loras=8", Target("thin", host.thin("direct")), adapters, c, host.pid),
    ]
    if raw_b is not None:
        arms.append(
            closed("vLLM max_loras=1", Target("thin", raw_b.thin("raw")), adapters, c, raw_b.pid)
        )
    _describe(section, arms, scale)
    section.workload += [
        engine_line(stack, "A", ENGINE_A),
        engine_line(stack, "B", ENGINE_B),
        "vLLM max_loras=8 = engine A's VllmEngine driven through bench.load.thin; vLLM "
        "max_loras=1 = AsyncLLM alone (bench.rig.raw_engine) with engine B's flags",
    ]
    runs = await paired.paired(gen, arms, scale.timing, scale.repeats, noise="A max_loras=8")
    paired.arm_table(section, runs)
    _batching_goals(section, runs)
    paired.close(section, runs, ("tokens_per_s",))
    section.notes.append(
        "vLLM's CPU LoRA path is plain PyTorch ops, so LoRA costs far more here than on a "
        "GPU: judge loraserve by vLLM's own gain on the same engines, measured beside it."
    )
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return runs


def _batching_goals(section: Section, runs: Runs) -> None:
    ours = runs.values("A max_loras=8", "tokens_per_s")
    ours_one = runs.values("B max_loras=1", "tokens_per_s")
    gain = paired_ratio(ours, ours_one)
    section.reported("loraserve max_loras 8 / max_loras 1 tok/s", gain, ".2f")
    if "vLLM max_loras=1" not in runs.windows:
        paired.ratio_goal(
            section,
            runs,
            "loraserve's gain / vLLM's gain (max_loras 8 over 1)",
            ("A max_loras=8", "vLLM max_loras=1"),
            "tokens_per_s",
            ">=",
            0.9,
        )
    else:
        vllm_gain = [
            a / b
            for a, b in zip(
                runs.values("vLLM max_loras=8", "tokens_per_s"),
                runs.values("vLLM max_loras=1", "tokens_per_s"),
                strict=True,
            )
        ]
        section.reported(
            "vLLM alone: max_loras 8 / max_loras 1 tok/s",
            paired_ratio(
                runs.values("vLLM max_loras=8", "tokens_per_s"),
                runs.values("vLLM max_loras=1", "tokens_per_s"),
            ),
            ".2f",
        )
        ours_gain = [a / b for a, b in zip(ours, ours_one, strict=True)]
        section.goal(
            "loraserve's gain / vLLM's gain (max_loras 8 over 1, keep vLLM's gain)",
            paired_ratio(ours_gain, vllm_gain),
            ">=",
            0.9,
            ".2f",
            metric="tokens_per_s",
        )
    section.reported(
        "8 adapters / base model tok/s (engine A)",
        runs.ratio("A max_loras=8", "A base model", "tokens_per_s"),
        ".2f",
    )


async def slots(report: Report, stack: Stack, gen: LoadGenerator, scale: Scale) -> Runs:
    """Benchmark 3: 32 adapters over 8 slots (uniform, Zipf 1.5) vs 8 over 8."""
    section = report.section(3, "More adapters than slots: 32 over 8, uniform and Zipf(1.5)")
    started = time.monotonic()
    arms, served_by = _slot_arms(stack, scale)
    _describe(section, arms, scale)
    section.workload += [
        engine_line(stack, "A", ENGINE_A),
        "popular = the 8 most likely adapters under Zipf, rare = the other 24",
    ]
    if stack.engine_c is not None:
        section.workload.append(f"{RAISED}: " + engine_line(stack, "C", ENGINE_C))
    samplers: dict[str, LoadSampler] = {}

    @asynccontextmanager
    async def sampled(arm: str) -> AsyncIterator[None]:
        sampler = samplers.setdefault(arm, LoadSampler(served_by[arm.removesuffix(paired.AGAIN)]))
        async with sampler.sampling():
            yield

    runs = await paired.paired(
        gen, arms, scale.timing, scale.repeats, noise="8 adapters / 8 slots", around=sampled
    )
    paired.arm_table(section, runs)
    section.table(
        "Requests in the engine while each arm ran (GetServerInfo every 100 ms, medians)",
        ["arm", "running (in the batch)", "waiting"],
        [[arm, *sampler.summary()] for arm, sampler in samplers.items()],
    )
    _slot_goals(section, runs)
    paired.close(section, runs, ("tokens_per_s",))
    section.notes.append(
        "vLLM's scheduler skips waiting requests whose adapter would exceed max_loras (no "
        "head-of-line blocking) and keeps every running request's adapter in its slot, so "
        "with many streams over 32 adapters only a part of them can share a step: the "
        "loss is smaller batches, the same with or without the service in front (the "
        "engine-direct arms)."
    )
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return runs


def _slot_arms(stack: Stack, scale: Scale) -> tuple[list[Arm], dict[str, str]]:
    """Benchmark 3's arms (engine C's when it is up), and the gRPC address each arm's
    requests reach (for the engine's running/waiting samples)."""
    host = stack.host
    assert host is not None
    c = scale.slot_concurrency
    eight = schedule_for(EIGHT, scale, max_tokens=scale.slot_tokens)
    uniform = schedule_for(tuple(tenant(i) for i in range(32)), scale, max_tokens=scale.slot_tokens)
    zipf = schedule_for(
        uniform.adapters, scale, max_tokens=scale.slot_tokens, popularity="zipf:1.5"
    )
    grpc_a, direct = grpc_target(host.child.address), Target("thin", host.thin("direct"))
    arms = [
        closed("8 adapters / 8 slots", grpc_a, eight, c, host.pid),
        closed("32 adapters uniform", grpc_a, uniform, c, host.pid),
        closed("32 adapters zipf 1.5", grpc_a, zipf, c, host.pid),
        closed("32 uniform, engine direct", direct, uniform, c, host.pid),
        closed("8 / 8, engine direct", direct, eight, c, host.pid),
    ]
    served_by = {arm.name: host.child.address for arm in arms}
    if stack.engine_c is not None:
        engine_c = stack.engine_c
        arms.append(closed(RAISED, grpc_target(engine_c.address), uniform, c, engine_c.process.pid))
        served_by[RAISED] = engine_c.address
    return arms, served_by


def _slot_goals(section: Section, runs: Runs) -> None:
    for arm in ("32 adapters uniform", "32 adapters zipf 1.5"):
        paired.ratio_goal(
            section,
            runs,
            f"{arm} / 8-over-8 tok/s",
            (arm, "8 adapters / 8 slots"),
            "tokens_per_s",
            ">=",
            0.85,
        )
    section.reported(
        "engine direct: 32 uniform / 8-over-8 tok/s",
        runs.ratio("32 uniform, engine direct", "8 / 8, engine direct", "tokens_per_s"),
        ".2f",
    )
    if RAISED in runs.windows:
        section.reported(
            "32 uniform with --max-loras 32 / 8-over-8 tok/s",
            runs.ratio(RAISED, "8 adapters / 8 slots", "tokens_per_s"),
            ".2f",
        )
    popular = {tenant(i) for i in range(8)}
    rare = {tenant(i) for i in range(8, 32)}
    windows = runs.windows["32 adapters zipf 1.5"]
    rare_p99 = [w.ttft_p(99, rare) for w in windows]
    popular_p99 = [w.ttft_p(99, popular) for w in windows]
    section.goal(
        "Zipf rare / popular TTFT p99", paired_ratio(rare_p99, popular_p99), "<=", 1.5, ".2f"
    )
