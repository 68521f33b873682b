"""How much work each benchmark does (`Scale`; --quick and the gpu profile shrink it)
and the arms the inference benchmarks build from the shared stack."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bench.load.drive import Load, Windows
from bench.load.loadclient import Arm
from bench.load.targets import Target
from bench.load.workload import Workload, run_closed_loop

# Prompt and output lengths of the throughput arms, and their streams.
CLOSED_STREAMS = 32


@dataclass(frozen=True)
class Scale(Windows):
    """How much work the inference benchmarks do (the windows: bench.load.drive.Windows)."""

    concurrency: int = CLOSED_STREAMS
    max_tokens: int = 64
    slot_concurrency: int = 64
    slot_tokens: int = 32
    storm_swaps: int = 20
    steady_s: float = 8.0
    cold_pairs: int = 10
    # Issue 28's loops: many clients, and few for latency.
    wide_concurrency: int = 128
    narrow_concurrency: int = 8
    # The open-loop arms' arrival rate (requests/s): about half of what the tiny model's
    # engine serves at 32 streams of 64 tokens (~400 tokens/s on two cores).
    poisson_rate: float = 3.0


# A smoke run: verdicts need 5 repeats, so a quick run reports figures only.
QUICK = Scale(repeats=2, storm_swaps=4, steady_s=4.0, cold_pairs=5)
# On a GPU (`--engine gpu`): 5 repeats (a verdict needs them), short windows: the
# engine is fast, so one second holds hundreds of steps (bench.method.gpu: the budgets).
GPU = Scale(
    warmup_s=0.5, window_s=1.0, storm_swaps=10, steady_s=4.0, cold_pairs=5, poisson_rate=50.0
)


def scale_for(engine: str, quick: bool) -> Scale:
    if quick:
        return QUICK
    return GPU if engine == "gpu" else Scale()


def closed(
    name: str, target: Target, workload: Workload, concurrency: int, front_pid: int | None
) -> Arm:
    """A closed-loop arm whose server front process is `front_pid` (None: not a server)."""
    watch = (("front", front_pid),) if front_pid is not None else ()
    return Arm(name, target, workload, Load("closed", concurrency=concurrency), watch)


def poisson(
    name: str, target: Target, workload: Workload, rate: float, front_pid: int | None
) -> Arm:
    watch = (("front", front_pid),) if front_pid is not None else ()
    return Arm(name, target, workload, Load("poisson", rate=rate), watch)


def schedule_for(adapters: tuple[str, ...], scale: Scale, **changes: object) -> Workload:
    """The throughput arms' schedule over `adapters`: repeated as long as a window needs."""
    base = Workload(
        adapters=adapters,
        concurrency=scale.concurrency,
        requests=max(256, 8 * len(adapters)),
        max_tokens=scale.max_tokens,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


async def warm_up(target_address: str, adapters: tuple[str, ...]) -> None:
    """One short pass over every adapter over gRPC, so first-use costs land outside
    the measured arms (not measured: run from the driver process)."""
    from bench.load.calls import grpc_caller, no_retry_client

    workload = Workload(adapters=adapters, concurrency=16, requests=2 * len(adapters), max_tokens=4)
    async with no_retry_client(target_address) as client:
        result = await run_closed_loop(workload, grpc_caller(client))
    if result.failures:
        first = next(r.error for r in result.records if r.error)
        raise RuntimeError(f"warm-up of {target_address} failed: {first}")
