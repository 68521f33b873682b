"""Benchmarks 1-5, 7 and 8 on one shared stack, ordered so each engine start serves as
many benchmarks as it can: engines A and B start together; 1, 2 and 7's two-engine
part run while both are up; B stops; 8 starts vLLM's own servers beside A and stops
them; then 24 more adapters for 7's per-adapter memory and for 3 (with engine C,
max_loras 32, up for 3 alone); then 4 and 5, whose pushes disturb nothing after them."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench import bench_memory, bench_swap, bench_throughput, bench_vllm, procs
from bench.report import Report
from bench.runs import Scale, grpc_arm
from bench.stack import PROFILES, Stack, tenant, wait_routed
from bench.workload import Workload


async def _warm_up(address: str, adapters: tuple[str, ...]) -> None:
    """One short pass over every adapter, so first-use costs land outside the arms."""
    workload = Workload(adapters=adapters, concurrency=16, requests=2 * len(adapters), max_tokens=4)
    await grpc_arm(address)(workload)


async def _more_adapters(
    stack: Stack, *, with_c: bool, measure: bool
) -> bench_memory.AdapterGrowth | None:
    """Pushes tenants 8-31 (with `measure`, in steps with nothing else running, so
    benchmark 7 gets each adapter's memory alone), then with_c starts engine C
    (max_loras 32). Both engines route all 32 and have served each once when this
    returns."""
    assert stack.host is not None
    everyone = tuple(tenant(i) for i in range(32))
    growth = None
    if measure:
        growth = await bench_memory.grow_adapters(stack)
    else:
        pushed = {tenant(i): await stack.push(tenant(i)) for i in range(8, 32)}
        await wait_routed(stack.host.child.address, pushed)
    engine_c = stack.start_c() if with_c else None
    await _warm_up(stack.host.child.address, everyone)
    if engine_c is not None:
        await procs.wait_serving(engine_c, stack.logs, 300)
        await wait_routed(engine_c.address, dict.fromkeys(everyone, 1))
        await _warm_up(engine_c.address, everyone)
    return growth


async def run(report: Report, wanted: set[int], scale: Scale, engine: str = "cpu") -> None:
    stack = Stack(
        report.results_dir, Path(tempfile.mkdtemp(prefix="bench-inference-")), PROFILES[engine]
    )
    setup = report.section(0, "Set-up of the inference benchmarks")
    started = time.monotonic()
    try:
        stack.build_models()
        await stack.start_store()
        for i in range(8):
            await stack.push(tenant(i))
        need_b = bool(wanted & {2, 7})
        engines_s = await stack.start_engines(with_b=need_b)
        setup.notes.append(
            f"engines {'A and B' if need_b else 'A'} SERVING after {engines_s:.0f} s"
        )
        assert stack.host is not None
        first8 = tuple(tenant(i) for i in range(8))
        await _warm_up(stack.host.child.address, (*first8, ""))
        if stack.engine_b is not None:
            await _warm_up(stack.engine_b.address, first8)
        setup.seconds = time.monotonic() - started
        report.print_section(setup)
        if 1 in wanted:
            await bench_throughput.overhead(report, stack, scale)
        if 2 in wanted:
            await bench_throughput.batching(report, stack, scale)
        memory = None
        if 7 in wanted:
            memory = await bench_memory.engines(stack, scale)
        stack.stop_b()
        if 8 in wanted:
            await bench_vllm.against_vllm(report, stack, scale)
        if wanted & {3, 7}:
            growth = await _more_adapters(stack, with_c=3 in wanted, measure=7 in wanted)
            if memory is not None and growth is not None:
                await bench_memory.report_memory(report, stack, memory, growth)
        if 3 in wanted:
            await bench_throughput.slots(report, stack, scale)
            stack.stop_c()
        if 4 in wanted:
            await bench_swap.hot_swap(report, stack, scale)
        if 5 in wanted:
            await bench_swap.cold_start(report, stack, scale)
    except Exception as exc:
        failed = report.sections[-1]
        failed.error = failed.error or f"{type(exc).__name__}: {exc}"
        report.print_section(failed)
        raise
    finally:
        await stack.close()
