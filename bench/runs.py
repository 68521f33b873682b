"""Running workloads from the benchmark driver (over gRPC) and in engine A's host
(in-process), interleaved so that drift in the machine's load hits every arm."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass

import grpc

from bench.calls import (
    grpc_caller,
    http_session,
    no_retry_client,
    openai_caller,
    vllm_grpc_caller,
)
from bench.stack import Host
from bench.workload import RunResult, Workload, run_closed_loop

Arm = Callable[[Workload], Awaitable[RunResult]]


@dataclass(frozen=True)
class Scale:
    """How much work each benchmark does; --quick shrinks it for a smoke run."""

    repeats: int = 3
    concurrency: int = 64
    max_tokens: int = 64
    slot_requests: int = 128
    slot_tokens: int = 32
    storm_swaps: int = 20
    steady_s: float = 8.0
    cold_pairs: int = 10


QUICK = Scale(repeats=1, slot_requests=64, storm_swaps=4, steady_s=3.0, cold_pairs=3)
# On a GPU (`--engine gpu`): the same workloads with fewer repeats, so that every
# benchmark, engine starts included, fits in a few minutes.
GPU = Scale(repeats=2, storm_swaps=10, steady_s=4.0, cold_pairs=5)


def scale_for(engine: str, quick: bool) -> Scale:
    if quick:
        return QUICK
    return GPU if engine == "gpu" else Scale()


def grpc_arm(address: str, until: float | None = None) -> Arm:
    async def run(workload: Workload) -> RunResult:
        async with no_retry_client(address) as client:
            return await run_closed_loop(workload, grpc_caller(client), until)

    return run


def openai_arm(base_url: str, base_model: str) -> Arm:
    """Streaming `/v1/completions` over HTTP (vllm serve, loraserve's OpenAI front)."""

    async def run(workload: Workload) -> RunResult:
        async with http_session() as http:
            return await run_closed_loop(workload, openai_caller(http, base_url, base_model))

    return run


def vllm_grpc_arm(address: str) -> Arm:
    """vLLM's own gRPC Generate (base model only)."""

    async def run(workload: Workload) -> RunResult:
        async with grpc.aio.insecure_channel(address) as channel:
            return await run_closed_loop(workload, vllm_grpc_caller(channel))

    return run


def host_arm(host: Host, arm: str) -> Arm:
    async def run(workload: Workload) -> RunResult:
        return await host.run(arm, workload)

    return run


Around = Callable[[str], AbstractAsyncContextManager[None]]


def _nothing(_: str) -> AbstractAsyncContextManager[None]:
    return nullcontext()


async def interleaved(
    arms: dict[str, tuple[Arm, Workload]], repeats: int, around: Around = _nothing
) -> dict[str, list[RunResult]]:
    """Runs every arm once per repeat, rotating the order each repeat; `around(arm)`
    wraps each run (probes that gather evidence while it runs)."""
    names: Sequence[str] = list(arms)
    results: dict[str, list[RunResult]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in [*names[shift:], *names[:shift]]:
            arm, workload = arms[name]
            async with around(name):
                result = await arm(workload)
            results[name].append(no_failures(name, result))
    return results


def no_failures(name: str, result: RunResult) -> RunResult:
    """`result`, or an error naming the first of its failed requests."""
    if result.failures:
        first = next(r.error for r in result.records if r.error)
        raise RuntimeError(f"{name}: {result.failures} failed requests, e.g. {first}")
    return result
