"""The GPU run: every benchmark has a gpu dry run whose engines share the device and
whose budgets fit the window, and a benchmark over its budget fails alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.method.report import Report


def test_the_gpu_dry_run_covers_every_benchmark_and_fits_the_device_and_window() -> None:
    """Every benchmark of either profile has command lines in the gpu dry run; every
    engine they start gets its share of the device, the shares up at once sum to at
    most 0.9, and the GPU run's budgets fit 15 minutes."""
    from bench.__main__ import PROFILE_BENCHMARKS
    from bench.method import gpu
    from bench.plan import check_gpu, plans

    every = {n for numbers in PROFILE_BENCHMARKS.values() for n in numbers}
    planned = plans("gpu")
    assert set(planned) == every
    assert check_gpu(planned) == []
    for plan in planned.values():
        engines = [
            argv
            for argv in plan.servers.values()
            if any(x == "--model" or x.startswith("--model=") for x in argv)
        ]
        assert all(any("gpu-memory-utilization" in x for x in argv) for argv in engines), (
            f"benchmark {plan.number} starts an engine with no share of the device"
        )
    assert set(gpu.BUDGETS_S) | set(gpu.LEFT_OUT) == every
    assert gpu.expected_total_s() <= gpu.WINDOW_S


async def test_a_benchmark_over_its_gpu_budget_fails_itself_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from bench.method import gpu

    monkeypatch.setitem(gpu.BUDGETS_S, 99, 0.01)
    report = Report(tmp_path, {})
    budget = gpu.Budget(enabled=True)
    async with budget.limit(report, 99):
        report.section(99, "a slow benchmark")
        await asyncio.Event().wait()  # never set: only the budget ends it
    assert "over its GPU budget of 0.01 s" in report.sections[-1].error

    async with gpu.Budget(enabled=False).limit(report, 99):
        await asyncio.sleep(0.02)  # no budget off the GPU
