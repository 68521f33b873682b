"""Benchmarks 1-5, 7, 8 and 13 on one shared stack, ordered so each engine start serves
as many benchmarks as it can: engine A starts with B and vLLM alone on B's flags when 2
or 7 need them; 1, 2 and 7's two-engine part run while they are up; they stop; 8 and 13
start vLLM's own servers beside A and stop them; then 24 more adapters for 7's
per-adapter memory and for 3 (with engine C, max_loras 32, up for 3 alone); then 4 and
5, whose pushes disturb nothing after them. Every measured load comes from one load
generator process (bench.load.loadgen)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from bench.inference import against_vllm, memory, stream, throughput
from bench.load.loadclient import LoadGenerator
from bench.method.gpu import Budget, Limit
from bench.method.report import Report
from bench.method.runs import Scale, warm_up
from bench.rig import baselines, procs, storeops
from bench.rig.stack import (
    ENGINE_A,
    ENGINE_B,
    ENGINE_START_S,
    PROFILES,
    Host,
    Stack,
    tenant,
    wait_routed,
)
from bench.swap import cold, hot
from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.testing.processes.services import free_port

EIGHT = tuple(tenant(i) for i in range(8))


async def _more_adapters(
    stack: Stack, *, with_c: bool, measure: bool
) -> memory.AdapterGrowth | None:
    """Pushes tenants 8-31 (with `measure`, in steps with nothing else running, so
    benchmark 7 gets each adapter's memory alone), then with_c starts engine C
    (max_loras 32). Both engines route all 32 and have served each once when this
    returns."""
    assert stack.host is not None
    everyone = tuple(tenant(i) for i in range(32))
    growth = None
    if measure:
        growth = await memory.grow_adapters(stack)
    else:
        pushed = {tenant(i): await stack.push(tenant(i)) for i in range(8, 32)}
        await wait_routed(stack.host.child.address, pushed)
    engine_c = stack.start_c() if with_c else None
    await warm_up(stack.host.child.address, everyone)
    if engine_c is not None:
        await procs.wait_serving(engine_c, stack.logs, ENGINE_START_S)
        await wait_routed(engine_c.address, dict.fromkeys(everyone, 1))
        await warm_up(engine_c.address, everyone)
    return growth


async def _raw_b(stack: Stack, report: Report) -> Host | None:
    """vLLM's AsyncLLM alone with engine B's flags (benchmark 2's vLLM max_loras 1)."""
    argv_b = stack.argv("raw-b", free_port(), ENGINE_B)
    adapters = {name: stack.adapters[name] for name in EIGHT}
    try:
        return await baselines.start_raw(stack.logs, argv_b, adapters, stack.profile.env, "raw-b")
    except Exception as exc:
        report.sections[-1].notes.append(f"vLLM alone with max_loras 1 did not start: {exc}")
        return None


async def _set_up(report: Report, stack: Stack, wanted: set[int]) -> Host | None:
    setup = report.section(0, "Set-up of the inference benchmarks")
    started = time.monotonic()
    stack.build_models()
    await stack.start_store()
    for name in EIGHT:
        await stack.push(name)
    need_b = bool(wanted & {2, 7})
    engines = stack.start_engines(with_b=need_b)
    raw_b: Host | None = None
    if 2 in wanted:
        engines_s, raw_b = await asyncio.gather(engines, _raw_b(stack, report))
    else:
        engines_s = await engines
    setup.notes.append(f"engines {'A and B' if need_b else 'A'} SERVING after {engines_s:.0f} s")
    assert stack.host is not None
    await warm_up(stack.host.child.address, (*EIGHT, ""))
    if stack.engine_b is not None:
        await warm_up(stack.engine_b.address, EIGHT)
    setup.seconds = time.monotonic() - started
    report.print_section(setup)
    return raw_b


async def _against_vllm(
    report: Report, stack: Stack, gen: LoadGenerator, scale: Scale, wanted: set[int], limit: Limit
) -> None:
    """Benchmarks 8 and 13, with vLLM's own servers up beside engine A."""
    serve_port, grpc_port = free_port(), free_port()
    cmds = against_vllm.baseline_commands(stack, serve_port, grpc_port)
    first = 8 if 8 in wanted else 13
    found: baselines.Baselines | None = None
    async with limit(report, first, phase="vLLM's servers"):
        found = await baselines.start(
            stack.logs, cmds, stack.profile.env, serve_port=serve_port, grpc_port=grpc_port
        )
    if found is None:
        return
    try:
        if found.serve_url:
            await _warm_http(found.serve_url, str(stack.model_dir))
        await _warm_http(stack.openai_url, stack.base_model_name)
        if 8 in wanted:
            async with limit(report, 8):
                await against_vllm.against_vllm(report, stack, gen, scale, found)
        if 13 in wanted:
            async with limit(report, 13):
                await stream.stream_speed(report, stack, gen, scale, found)
    finally:
        found.stop()


async def _warm_http(url: str, base_model: str) -> None:
    from bench.load.calls import http_session, openai_caller
    from bench.load.workload import Workload, run_closed_loop

    async with http_session() as http:
        call = openai_caller(http, url, base_model)
        await run_closed_loop(Workload(EIGHT, 8, 16, 4), call)


async def _cold(report: Report, stack: Stack, scale: Scale) -> None:
    """Benchmark 5 on engine A."""
    assert stack.host is not None
    assert stack.store_channel is not None
    stub = storeops.store_stub(stack.store_channel)

    async def variant(_: int) -> AdapterFiles:
        return await storeops.hashed((await hot.fresh_variants(stack, 1))[0])

    async def push(name: str, files: AdapterFiles) -> int:
        return await storeops.push(stub, name, files)

    engine = throughput.engine_line(stack, "A", ENGINE_A)
    await cold.cold_start(
        report, stack.host.child.address, scale.cold_pairs, variant, push, [engine]
    )


async def run(
    report: Report,
    wanted: set[int],
    scale: Scale,
    engine: str = "cpu",
    budget: Budget | None = None,
) -> None:
    stack = Stack(
        report.results_dir, Path(tempfile.mkdtemp(prefix="bench-inference-")), PROFILES[engine]
    )
    gen = LoadGenerator(stack.logs)
    limit = (budget or Budget(enabled=False)).limit
    raw_b: Host | None = None
    try:
        await gen.start()
        async with limit(report, 0, phase="set-up", fatal=True):
            raw_b = await _set_up(report, stack, wanted)
        if 1 in wanted:
            async with limit(report, 1):
                await throughput.overhead(report, stack, gen, scale)
        if 2 in wanted:
            async with limit(report, 2):
                await throughput.batching(report, stack, gen, scale, raw_b)
        engine_memory = await memory.engines(stack, gen, scale) if 7 in wanted else None
        if raw_b is not None:
            raw_b.stop()
            raw_b = None
        stack.stop_b()
        if wanted & {8, 13}:
            await _against_vllm(report, stack, gen, scale, wanted, limit)
        await _slots_and_swaps(report, stack, gen, scale, wanted, engine_memory, limit)
    except Exception as exc:
        failed = report.sections[-1]
        failed.error = failed.error or f"{type(exc).__name__}: {exc}"
        report.print_section(failed)
        raise
    finally:
        if raw_b is not None:
            raw_b.stop()
        await gen.close()
        await stack.close()


async def _slots_and_swaps(
    report: Report,
    stack: Stack,
    gen: LoadGenerator,
    scale: Scale,
    wanted: set[int],
    engine_memory: memory.EngineMemory | None,
    limit: Limit,
) -> None:
    """7's per-adapter memory, 3 (engine C beside A), 4 and 5."""
    if wanted & {3, 7}:
        growth = await _more_adapters(stack, with_c=3 in wanted, measure=7 in wanted)
        if engine_memory is not None and growth is not None:
            await memory.report_memory(report, stack, engine_memory, growth)
    if 3 in wanted:
        async with limit(report, 3):
            await throughput.slots(report, stack, gen, scale)
        stack.stop_c()
    if 4 in wanted:
        async with limit(report, 4):
            await hot.hot_swap(report, stack, gen, scale)
    if 5 in wanted:
        async with limit(report, 5):
            await _cold(report, stack, scale)
