"""Benchmarks 1-5 and 7 on one shared stack, ordered so each engine start serves as
many benchmarks as it can: engines A and B start together; 1, 2 and 7's two-engine
part run while both are up; B stops; then 24 more adapters for 7's per-adapter memory
and for 3; then 4 and 5, whose pushes disturb nothing after them."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench import bench_memory, bench_swap, bench_throughput
from bench.report import Report
from bench.runs import QUICK, Scale, grpc_arm
from bench.stack import Stack, tenant
from bench.workload import Workload


async def _warm_up(address: str, adapters: tuple[str, ...]) -> None:
    """One short pass over every adapter, so first-use costs land outside the arms."""
    workload = Workload(adapters=adapters, concurrency=16, requests=2 * len(adapters), max_tokens=4)
    await grpc_arm(address)(workload)


async def run(report: Report, wanted: set[int], *, quick: bool) -> None:
    scale = QUICK if quick else Scale()
    stack = Stack(report.results_dir, Path(tempfile.mkdtemp(prefix="bench-inference-")))
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
        if wanted & {3, 7}:
            # Tenants 8..31 join with nothing else running: benchmark 7's per-adapter memory.
            growth = await bench_memory.grow_adapters(stack)
            await _warm_up(stack.host.child.address, tuple(tenant(i) for i in range(32)))
            if memory is not None:
                await bench_memory.report_memory(report, stack, memory, growth)
        if 3 in wanted:
            await bench_throughput.slots(report, stack, scale)
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
