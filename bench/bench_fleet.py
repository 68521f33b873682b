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
the round-robin arm differs in the balancing policy alone.
"""

from __future__ import annotations

import asyncio
import json
import signal
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import grpc
import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench import procs
from bench.bench_swap import fresh_variants, push_fresh
from bench.drive import Load, Windows
from bench.loadclient import Arm, LoadGenerator
from bench.paired import Runs, arm_table, failure_check, noise_figures, paired, ratio_goal
from bench.report import Report, Section
from bench.stack import PROFILES, RANK, Stack, current_revisions, tenant
from bench.stack import wait_routed as wait_routed_on
from bench.stats import median_interval, percentile, ratio
from bench.targets import Target
from bench.workload import Caller, Workload, run_closed_loop
from loraserve.clients.channels import Retry
from loraserve.clients.routing import (
    ADAPTER_HASH_HEADER,
    affinity_key,
    enable_ring_hash,
    ring_hash_config,
)
from loraserve.common.sizes import MESSAGE_LIMIT_OPTIONS
from loraserve.inference.serving import SERVICE_NAME
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.processes import free_port

NUMBER = 10
ENGINE = procs.EngineConfig(max_loras=4, max_cpu_loras=32, max_lora_rank=RANK)
SWAP = "swap"
# Retries UNAVAILABLE before the first response, as the client library does: a call
# to a replica that just died moves to the next one on the ring.
RETRY = Retry(max_attempts=5, initial_backoff_s=0.1, max_backoff_s=1.0)
CALL_TIMEOUT_S = 300.0
POLL_S = 0.01
# Stops a hung run only; the figure is the time measured.
ROUTED_GUARD_S = 120.0
Policy = Literal["ring_hash", "round_robin"]


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


def fleet_channel(addresses: Sequence[str], policy: Policy) -> grpc.aio.Channel:
    """One channel over every replica; ring_hash sends all calls carrying one adapter
    header value to one replica."""
    balancing = ring_hash_config() if policy == "ring_hash" else {"round_robin": {}}
    config = {
        "loadBalancingConfig": [balancing],
        "methodConfig": [RETRY.method_config(SERVICE_NAME)],
    }
    options = [*MESSAGE_LIMIT_OPTIONS, ("grpc.service_config", json.dumps(config))]
    return grpc.aio.insecure_channel("ipv4:" + ",".join(addresses), options=options)


def fleet_caller(channel: grpc.aio.Channel) -> Caller:
    stub = pb_grpc.InferenceServiceStub(channel)

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        request = pb.GenerateRequest(
            adapter=adapter,
            token_ids=pb.TokenIds(ids=list(prompt)),
            sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )
        metadata = ((ADAPTER_HASH_HEADER, affinity_key(adapter)),)
        call = stub.Generate(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
        try:
            async for message in call:
                yield len(message.token_ids), message.revision
        finally:
            call.cancel()

    return call


@dataclass
class Replica:
    child: procs.Child
    metrics_port: int


def replica_argv(stack: Stack, i: int, port: int, metrics_port: int) -> list[str]:
    """`inference serve` flags of the fleet's replica `i` (the stack's engine profile)."""
    return [*stack.argv(f"fleet-{i}", port, ENGINE), f"--metrics-port={metrics_port}"]


class Fleet:
    """The store stack plus `replicas` inference servers with metrics."""

    def __init__(self, stack: Stack, scale: FleetScale) -> None:
        self.stack = stack
        self.scale = scale
        self.replicas: list[Replica] = []

    @property
    def addresses(self) -> list[str]:
        return [r.child.address for r in self.replicas]

    async def start(self) -> None:
        for i in range(self.scale.replicas):
            port, metrics_port = free_port(), free_port()
            child = procs.start_inference(
                self.stack.logs,
                f"fleet-{i}",
                replica_argv(self.stack, i, port, metrics_port),
                f"127.0.0.1:{port}",
                self.stack.profile.env,
            )
            self.stack.children.append(child)
            self.replicas.append(Replica(child, metrics_port))
        await asyncio.gather(
            *(procs.wait_serving(r.child, self.stack.logs, 600) for r in self.replicas)
        )

    async def wait_routed(self, wanted: dict[str, int]) -> None:
        await asyncio.gather(*(wait_routed_on(address, wanted) for address in self.addresses))

    async def served(self) -> list[Counter[str]]:
        """Per replica: requests finished OK, by adapter (its own counter)."""
        return await asyncio.gather(
            *(asyncio.to_thread(_served, r.metrics_port) for r in self.replicas)
        )

    def kill(self, index: int) -> None:
        """SIGKILL, as a crash; the engine process it leaves behind is killed too."""
        process = self.replicas[index].child.process
        orphans = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGKILL)
        process.wait()
        for orphan in orphans:
            orphan.kill()


def _served(metrics_port: int) -> Counter[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as r:
        text = r.read().decode()
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "loraserve_inference_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels["code"] == "OK":
                    counts[sample.labels["adapter"]] += int(sample.value)
    return counts


def _affinity(before: list[Counter[str]], after: list[Counter[str]]) -> tuple[float, float]:
    """(overall, worst adapter's) share of requests served by the adapter's top replica."""
    per_replica = [a - b for a, b in zip(after, before, strict=True)]
    adapters = set().union(*per_replica)
    top = {a: max(c[a] for c in per_replica) for a in adapters}
    total = {a: sum(c[a] for c in per_replica) for a in adapters}
    worst = min((top[a] / total[a] for a in adapters if total[a]), default=float("nan"))
    return ratio(sum(top.values()), sum(total.values())), worst


async def _throughput_and_affinity(
    section: Section, fleet: Fleet, gen: LoadGenerator, adapters: tuple[str, ...]
) -> None:
    scale = fleet.scale
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
        shares.setdefault(arm, []).append(_affinity(before, await fleet.served()))

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


async def _convergence(section: Section, fleet: Fleet) -> None:
    """Push -> the last of the replicas routes the new revision, polled every 10 ms."""
    seconds: list[float] = []
    for directory in await fresh_variants(fleet.stack, fleet.scale.pushes):
        started = time.monotonic()
        revision = await push_fresh(fleet.stack, directory)
        async with asyncio.timeout(ROUTED_GUARD_S):
            await asyncio.gather(*(_routed(address, revision) for address in fleet.addresses))
        seconds.append(time.monotonic() - started)
    section.workload.append(
        f"{fleet.scale.pushes} pushes of `{SWAP}`, new weights each (one at a time, fleet "
        "idle); each timed, hashing included, "
        f"from the push's start to the last replica routing the new revision"
    )
    section.record_values("push -> all replicas serving", "seconds", seconds)
    p99 = percentile(seconds, 99)
    section.table(
        f"push -> all {fleet.scale.replicas} replicas serving the new revision",
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


async def _failover(section: Section, fleet: Fleet, adapters: tuple[str, ...]) -> None:
    """Uniform load with ring_hash; the last replica is SIGKILLed once it has served a
    few of it. A call it held fails mid-stream; one it had not answered moves on."""
    scale = fleet.scale
    workload = Workload(
        adapters=adapters,
        concurrency=scale.concurrency,
        requests=scale.requests,
        max_tokens=scale.max_tokens,
        seed=1,
    )
    victim = len(fleet.replicas) - 1
    async with fleet_channel(fleet.addresses, "ring_hash") as channel:
        before = (await fleet.served())[victim]
        load = asyncio.create_task(run_closed_loop(workload, fleet_caller(channel)))
        while not load.done():
            served = (await fleet.served())[victim] - before
            if served.total() >= max(1, scale.concurrency // (2 * scale.replicas)):
                break
            await asyncio.sleep(0.05)
        held = await _in_flight(fleet.addresses[victim])
        killed_at = time.monotonic()
        fleet.kill(victim)
        result = await load
    failed = [r for r in result.records if r.error]
    before_first = [r for r in failed if not r.first_token]
    after_kill = [r for r in result.records if r.submitted >= killed_at]
    section.workload.append(f"failover: {workload.describe()}; replica {victim} SIGKILLed")
    section.record(
        "failover",
        [
            {
                "requests": len(result.records),
                "failed_before_first_token": len(before_first),
                "failed_mid_stream": len(failed) - len(before_first),
            }
        ],
    )
    section.table(
        f"one of {scale.replicas} replicas SIGKILLed mid-load (ring_hash, retried before "
        "the first token)",
        ["requests", "sent after the kill", "failed before first token", "failed mid-stream"],
        [
            [
                len(result.records),
                len(after_kill),
                len(before_first),
                len(failed) - len(before_first),
            ]
        ],
    )
    if before_first:
        section.notes.append(f"first failure before a token: {before_first[0].error}")
    section.check(
        "requests failed before their first token, a replica SIGKILLed",
        len(before_first),
        "0",
        not before_first,
    )
    mid_stream = len(failed) - len(before_first)
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
    fleet = Fleet(stack, scale)
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
        await _throughput_and_affinity(section, fleet, gen, adapters)
        await _convergence(section, fleet)
        await _failover(section, fleet, adapters)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        section.seconds = time.monotonic() - started
        report.print_section(section)
        await gen.close()
        await stack.close()
