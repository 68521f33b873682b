"""Benchmark 10's fleet: N `inference serve` replicas with metrics on one store, a
gRPC channel over all of them balanced by ring_hash on the adapter header (as the
client library does, `loraserve.clients.routing`) or round robin, the replicas' own
per-adapter request counters, and a crash (SIGKILL) of one."""

from __future__ import annotations

import asyncio
import json
import signal
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

from bench.load.calls import grpc_stub_caller
from bench.load.workload import Caller
from bench.method.stats import ratio
from bench.rig import procs
from bench.rig.stack import RANK, Stack
from bench.rig.stack import wait_routed as wait_routed_on
from loraserve.clients.channels import Retry
from loraserve.clients.routing import ring_hash_config
from loraserve.common.config.sizes import MESSAGE_LIMIT_OPTIONS
from loraserve.inference.serving import SERVICE_NAME
from loraserve.testing.haproxy import running_haproxy
from loraserve.testing.processes.services import free_port
from loraserve.testing.waiting import eventually

HAPROXY_CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"

ENGINE = procs.EngineConfig(max_loras=4, max_cpu_loras=32, max_lora_rank=RANK)
# Retries UNAVAILABLE before the first response, as the client library does: a call
# to a replica that just died moves to the next one on the ring.
RETRY = Retry(max_attempts=5, initial_backoff_s=0.1, max_backoff_s=1.0)
CALL_TIMEOUT_S = 300.0
Policy = Literal["ring_hash", "round_robin"]


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
    """The raw stub over the fleet's channel, each call with its adapter's ring_hash key."""
    return grpc_stub_caller(channel, affinity=True, timeout=CALL_TIMEOUT_S)


@dataclass
class Replica:
    child: procs.Child
    metrics_port: int


def replica_argv(stack: Stack, i: int, port: int, metrics_port: int) -> list[str]:
    """`inference serve` flags of the fleet's replica `i` (the stack's engine profile)."""
    # The load's caller keys (x-rollout-key) name its callers, as a trusted gateway's do.
    return [
        *stack.argv(f"fleet-{i}", port, ENGINE),
        f"--metrics-port={metrics_port}",
        "--trust-rollout-key-header",
    ]


class Fleet:
    """The store stack plus `replicas` inference servers with metrics."""

    def __init__(self, stack: Stack, count: int) -> None:
        self.stack = stack
        self.count = count
        self.replicas: list[Replica] = []
        self.killed: set[int] = set()

    @property
    def addresses(self) -> list[str]:
        return [r.child.address for r in self.replicas]

    async def start(self) -> None:
        for i in range(self.count):
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
        """Per replica: requests finished OK, by adapter (its own counter); nothing for a
        replica killed (its counters went with it)."""
        return await asyncio.gather(
            *(
                asyncio.to_thread(_served, r.metrics_port) if i not in self.killed else _nothing()
                for i, r in enumerate(self.replicas)
            )
        )

    def kill(self, index: int) -> None:
        """SIGKILL, as a crash; the engine process it leaves behind is killed too."""
        self.killed.add(index)
        process = self.replicas[index].child.process
        orphans = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGKILL)
        process.wait()
        for orphan in orphans:
            orphan.kill()


async def _nothing() -> Counter[str]:
    return Counter()


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


def served_between(before: list[Counter[str]], after: list[Counter[str]]) -> list[Counter[str]]:
    """Per replica: requests it finished OK between two readings, by adapter."""
    return [a - b for a, b in zip(after, before, strict=True)]


def affinity(per_replica: list[Counter[str]]) -> float:
    """The share of all requests that their adapter's top replica served."""
    adapters = set().union(*per_replica)
    top = sum(max(c[a] for c in per_replica) for a in adapters)
    return ratio(top, sum(c.total() for c in per_replica))


def replica_shares(per_replica: list[Counter[str]]) -> list[float]:
    """Each replica's share of all requests, in replica order: round robin's are each
    near 1/replicas only if every replica was in its choice all window."""
    total = sum(c.total() for c in per_replica)
    return [ratio(c.total(), total) for c in per_replica]


def adapter_shares(
    runs: Sequence[list[Counter[str]]], replicas: int, min_requests: int
) -> dict[str, float]:
    """Each adapter's share of its requests on its top replica of each run, every run
    pooled (its top replica's requests summed over the runs, over all its requests), for
    the adapters with fewer requests than one replica's share of all (the others must
    spread to be served) and at least `min_requests` (a share of two requests says
    nothing). The top replica is each run's own: between runs, the arms in between
    load every adapter everywhere and the clients start afresh, so an adapter may settle
    on another replica; within a run, it must keep to one."""
    top: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for run in runs:
        for adapter in set().union(*run):
            top[adapter] += max(counts[adapter] for counts in run)
            total[adapter] += sum(counts[adapter] for counts in run)
    share = total.total() / replicas
    return {a: top[a] / n for a, n in sorted(total.items()) if min_requests <= n < share}


def same_replica_shares(
    runs: Sequence[list[Counter[str]]], replicas: int, min_requests: int
) -> dict[str, float]:
    """As `adapter_shares`, with one top replica over every run pooled: whether an
    adapter also came back to the same replica in every run."""
    pooled = [sum((run[i] for run in runs), Counter()) for i in range(replicas)]
    return adapter_shares([pooled], replicas, min_requests)


@asynccontextmanager
async def fleet_proxy(fleet: Fleet, logs: Path) -> AsyncIterator[str]:
    """HAProxy on deploy/haproxy/haproxy.cfg in front of the fleet; its address."""
    servers = {f"replica-{i}": address for i, address in enumerate(fleet.addresses)}
    async with running_haproxy(HAPROXY_CONFIG, logs / "haproxy", servers) as proxy:
        await asyncio.gather(
            *(eventually(lambda s=s: proxy.in_pool(s), f"{s} in the pool") for s in servers)
        )
        yield proxy.address
