"""Benchmark 10: three inference replicas on one store, routed by adapter.

Side by side in one run, on three plain `inference serve` processes (max_loras 4 each)
and 24 adapters:

- affinity: the share of each adapter's requests that one replica served (from the
  replicas' own per-adapter request counters), with gRPC's ring_hash on the adapter
  header vs round robin;
- tokens/s over a Zipf popularity, ring_hash ÷ round robin, arms interleaved;
- push -> all three replicas route the new revision, over `pushes` pushes;
- one replica SIGKILLed mid-load: failed requests, before and after their first token.

The ring_hash arm balances as `loraserve.clients.inference.InferenceClient` does over
several replicas (the same service config entry and header, `loraserve.clients.routing`);
the round-robin arm differs in the balancing policy alone. The failover runs through
`InferenceClient` itself: gRPC's own retry policy ends at a call's response headers, so
a replica killed after it sent a stream's first message, before the caller read it,
fails that call UNAVAILABLE with no token and gRPC never sends it again (one request
in 480 did so at e21d4ae); the client retries until a message reaches its caller.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from bench.fleet.rig import CALL_TIMEOUT_S, ENGINE, Fleet, affinity, fleet_caller, fleet_channel
from bench.load.calls import grpc_caller
from bench.load.drive import Load, Windows
from bench.load.loadclient import Arm, LoadGenerator
from bench.load.targets import Target
from bench.load.workload import RunResult, Workload, run_closed_loop
from bench.method.paired import Runs, arm_table, failure_check, noise_figures, paired, ratio_goal
from bench.method.report import Report, Section
from bench.method.stats import median_interval, percentile
from bench.rig.stack import PROFILES, Stack, current_revisions, tenant
from bench.swap.hot import fresh_variants, push_fresh
from loraserve.clients.inference import InferenceClient
from loraserve.clients.routing import (
    enable_ring_hash,
)
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc

NUMBER = 10
SWAP = "swap"
POLL_S = 0.01
# Stops a hung run only; the figure is the time measured.
ROUTED_GUARD_S = 120.0


@dataclass(frozen=True)
class FleetScale(Windows):
    replicas: int = 3
    adapters: int = 24
    concurrency: int = 48
    requests: int = 480
    max_tokens: int = 32
    popularity: str = "zipf:1.0"
    pushes: int = 20


QUICK = FleetScale(concurrency=12, requests=48, max_tokens=8, repeats=2, pushes=3)
GPU = FleetScale(warmup_s=0.5, window_s=1.5, pushes=10)


async def _throughput_and_affinity(
    section: Section,
    fleet: Fleet,
    scale: FleetScale,
    gen: LoadGenerator,
    adapters: tuple[str, ...],
) -> None:
    workload = Workload(
        adapters=adapters,
        concurrency=scale.concurrency,
        requests=scale.requests,
        max_tokens=scale.max_tokens,
        popularity=scale.popularity,
    )
    addresses = ",".join(fleet.addresses)
    # Every replica's server process is a front of these arms.
    fronts = tuple(
        ("front" if i == 0 else f"front_{i}", r.child.process.pid)
        for i, r in enumerate(fleet.replicas)
    )
    arms = [
        Arm(
            policy,
            Target(f"fleet_{policy}", addresses),
            workload,
            Load("closed", concurrency=scale.concurrency),
            fronts,
        )
        for policy in ("ring_hash", "round_robin")
    ]
    section.workload += [arm.describe() for arm in arms]
    section.workload.append(f"{scale.repeats} repeats, order rotated; {scale.timing.describe()}")
    shares: dict[str, list[tuple[float, float]]] = {}

    @asynccontextmanager
    async def counting(arm: str) -> AsyncIterator[None]:
        before = await fleet.served()
        yield
        shares.setdefault(arm, []).append(affinity(before, await fleet.served()))

    warm = Workload(adapters=adapters, concurrency=8, requests=len(adapters), max_tokens=2)
    async with fleet_channel(fleet.addresses, "round_robin") as channel:
        await run_closed_loop(warm, fleet_caller(channel))
    runs = await paired(
        gen, arms, scale.timing, scale.repeats, noise="round_robin", around=counting
    )
    for arm, windows in runs.windows.items():
        section.record(
            arm,
            [
                {**w.summary(), "top_replica_share": top, "worst_adapter_share": worst}
                for w, (top, worst) in zip(windows, shares[arm], strict=True)
            ],
        )
    arm_table(section, runs)
    _fleet_goals(section, runs, shares)


def _fleet_goals(
    section: Section, runs: Runs, shares: dict[str, list[tuple[float, float]]]
) -> None:
    scale_label = f"max_loras {ENGINE.max_loras}"
    section.goal(
        "share of an adapter's requests served by one replica (ring_hash, %)",
        median_interval([top * 100 for top, _ in shares["ring_hash"]]),
        ">=",
        95.0,
        ".1f",
    )
    section.reported(
        "worst adapter's share on its top replica (ring_hash, %)",
        median_interval([worst * 100 for _, worst in shares["ring_hash"]]),
        ".1f",
    )
    ratio_goal(
        section,
        runs,
        f"tokens/s ring_hash ÷ round robin ({scale_label})",
        ("ring_hash", "round_robin"),
        "tokens_per_s",
        ">",
        1.0,
    )
    ratio_goal(
        section,
        runs,
        "TTFT p99 ring_hash ÷ round robin (a hot replica's queue)",
        ("ring_hash", "round_robin"),
        "ttft_p99_ms",
        "<=",
        1.5,
    )
    noise_figures(section, runs, ("tokens_per_s", "ttft_p99_ms"))
    failure_check(section, runs)


async def _convergence(section: Section, fleet: Fleet, scale: FleetScale) -> None:
    """Push -> the last of the replicas routes the new revision, polled every 10 ms."""
    seconds: list[float] = []
    for directory in await fresh_variants(fleet.stack, scale.pushes):
        started = time.monotonic()
        revision = await push_fresh(fleet.stack, directory)
        async with asyncio.timeout(ROUTED_GUARD_S):
            await asyncio.gather(*(_routed(address, revision) for address in fleet.addresses))
        seconds.append(time.monotonic() - started)
    section.workload.append(
        f"{scale.pushes} pushes of `{SWAP}`, new weights each (one at a time, fleet "
        "idle); each timed, hashing included, "
        f"from the push's start to the last replica routing the new revision"
    )
    section.record_values("push -> all replicas serving", "seconds", seconds)
    p99 = percentile(seconds, 99)
    section.table(
        f"push -> all {scale.replicas} replicas serving the new revision",
        ["pushes", "median [interval] s", "p99 s", "max s"],
        [[len(seconds), median_interval(seconds).text(".3f"), p99, max(seconds)]],
    )
    section.reported("push -> all replicas serving, median (s)", median_interval(seconds), ".3f")
    section.check(
        f"push -> all replicas serving, p99 of {len(seconds)} pushes (s)",
        p99,
        "< 1 s",
        p99 < 1.0,
        ".3f",
    )


async def _routed(address: str, revision: int) -> None:
    while True:
        if (await current_revisions(address)).get(SWAP, 0) >= revision:
            return
        await asyncio.sleep(POLL_S)


async def _failover(
    section: Section, fleet: Fleet, scale: FleetScale, adapters: tuple[str, ...]
) -> None:
    """Uniform load through `InferenceClient`; the last replica is SIGKILLed once it has
    served a few of it. A call it held fails mid-stream; one it had not answered moves on."""
    workload = Workload(
        adapters=adapters,
        concurrency=scale.concurrency,
        requests=scale.requests,
        max_tokens=scale.max_tokens,
        seed=1,
    )
    victim = len(fleet.replicas) - 1
    async with InferenceClient(",".join(fleet.addresses), timeout=CALL_TIMEOUT_S) as client:
        before = (await fleet.served())[victim]
        load = asyncio.create_task(run_closed_loop(workload, grpc_caller(client)))
        while not load.done():
            served = (await fleet.served())[victim] - before
            if served.total() >= max(1, scale.concurrency // (2 * scale.replicas)):
                break
            await asyncio.sleep(0.05)
        held = await _in_flight(fleet.addresses[victim])
        killed_at = time.monotonic()
        fleet.kill(victim)
        result = await load
    section.workload.append(f"failover: {workload.describe()}; replica {victim} SIGKILLed")
    failover_figures(section, result, killed_at, held, scale.replicas)


def failover_figures(
    section: Section, result: RunResult, killed_at: float, held: int, replicas: int
) -> None:
    """Failures before the first token (none may: the call moves on) and mid-stream (at
    most the streams the dead replica held)."""
    failed = [r for r in result.records if r.error]
    before_first = [r for r in failed if not r.first_token]
    mid_stream = len(failed) - len(before_first)
    after_kill = [r for r in result.records if r.submitted >= killed_at]
    counts = {
        "requests": len(result.records),
        "sent_after_the_kill": len(after_kill),
        "failed_before_first_token": len(before_first),
        "failed_mid_stream": mid_stream,
        "held_by_the_killed_replica": held,
    }
    section.record("failover", [counts])
    section.table(
        f"one of {replicas} replicas SIGKILLed mid-load (InferenceClient: ring_hash, retried "
        "before the first token)",
        list(counts),
        [list(counts.values())],
    )
    if before_first:
        section.notes.append(f"first failure before a token: {before_first[0].error}")
    section.check(
        "requests failed before their first token, a replica SIGKILLed",
        len(before_first),
        "0",
        not before_first,
    )
    section.check(
        "requests failed mid-stream, a replica SIGKILLed",
        mid_stream,
        f"<= the {held} it was running or queueing when killed (a stream cannot move)",
        mid_stream <= held,
    )


async def _in_flight(address: str) -> int:
    """Requests a replica runs or queues now (its GetServerInfo)."""
    async with grpc.aio.insecure_channel(address) as channel:
        info = await pb_grpc.InferenceServiceStub(channel).GetServerInfo(pb.GetServerInfoRequest())
    return int(info.running_requests + info.waiting_requests)


async def run(
    report: Report, *, quick: bool, engine: str = "cpu", scale: FleetScale | None = None
) -> None:
    """Benchmark 10."""
    enable_ring_hash()
    scale = scale or (QUICK if quick else GPU if engine == "gpu" else FleetScale())
    section = report.section(NUMBER, f"Fleet: {scale.replicas} replicas routed by adapter")
    stack = Stack(
        report.results_dir, Path(tempfile.mkdtemp(prefix="bench-fleet-")), PROFILES[engine]
    )
    fleet = Fleet(stack, scale.replicas)
    # Started after enable_ring_hash(): gRPC reads the variable at process start.
    gen = LoadGenerator(stack.logs)
    started = time.monotonic()
    try:
        await gen.start()
        stack.build_models()
        await stack.start_store()
        adapters = tuple(tenant(i) for i in range(scale.adapters))
        pushed = {name: await stack.push(name) for name in adapters}
        await fleet.start()
        await fleet.wait_routed(pushed)
        section.notes.append(
            f"{scale.replicas} replicas SERVING and routing {scale.adapters} adapters after "
            f"{time.monotonic() - started:.0f} s; max_loras {ENGINE.max_loras} each"
        )
        await _throughput_and_affinity(section, fleet, scale, gen, adapters)
        await _convergence(section, fleet, scale)
        await _failover(section, fleet, scale, adapters)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        section.seconds = time.monotonic() - started
        report.print_section(section)
        await gen.close()
        await stack.close()
