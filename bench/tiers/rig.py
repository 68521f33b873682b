"""What benchmark 11 runs on: two stores on one moto S3 (one seeded with a few
adapters, one with thousands, through the real push API), fresh `inference serve`
replicas with a bounded adapter cache, their Prometheus metrics and their disk."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from prometheus_client.parser import text_string_to_metric_families

from bench.rig import procs, storeops
from bench.rig.stack import RANK, Stack
from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.testing.processes.services import free_port

# Slots as engine A's; host memory sized to what the disk bound holds (about 200 of these
# adapters), as the README's tuning advice says: with 32, vLLM re-reads from disk every
# adapter of the long tail inside the engine step, in the 2,000-adapter arm only.
ENGINE = procs.EngineConfig(max_loras=8, max_cpu_loras=256, max_lora_rank=RANK)
SERVING_TIMEOUT_S = 600.0
DOWNLOADS = "loraserve_inference_adapter_downloads_total"
CACHE_BYTES = "loraserve_inference_adapter_cache_bytes"


def adapter_name(i: int) -> str:
    return f"ad{i:04d}"


class MissingMetric(LookupError):
    """The replica exports no sample of a metric the benchmark needs."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition (counters keep their `_total`)."""
    return [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def metric(samples: Sequence[Sample], name: str, **labels: str) -> float:
    """The sum of `name`'s samples carrying `labels`; MissingMetric if it has none."""
    named = [s for s in samples if s.name == name]
    if not named:
        raise MissingMetric(f"the replica exports no {name}")
    return sum(s.value for s in named if labels.items() <= s.labels.items())


def metric_or_nan(samples: Sequence[Sample], name: str, **labels: str) -> float:
    try:
        return metric(samples, name, **labels)
    except MissingMetric:
        return float("nan")


@dataclass(frozen=True)
class DiskUse:
    """Bytes of the regular files under a directory, a file linked twice counted once;
    `dotfiles`: those of files whose name starts with a dot (the cache's index and
    manifests, as opposed to the adapters' own files)."""

    total: int
    dotfiles: int


def disk_use(root: Path) -> DiskUse:
    sizes: dict[tuple[int, int], tuple[int, bool]] = {}
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                st = os.lstat(os.path.join(directory, name))
            except FileNotFoundError:  # evicted while we walked
                continue
            if stat.S_ISREG(st.st_mode):
                sizes[(st.st_dev, st.st_ino)] = (st.st_size, name.startswith("."))
    return DiskUse(
        sum(size for size, _ in sizes.values()),
        sum(size for size, dot in sizes.values() if dot),
    )


async def seed(
    channel: grpc.aio.Channel,
    names: Sequence[str],
    sources: Sequence[AdapterFiles],
    concurrency: int,
) -> dict[str, int]:
    """Pushes `names[i]` with the files of `sources[i % len(sources)]`, `concurrency`
    pushes at a time, as `adapterctl push` does; returns name -> revision."""
    stub = storeops.store_stub(channel)
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int, name: str) -> tuple[str, int]:
        async with limit:
            return name, await storeops.push(stub, name, sources[i % len(sources)])

    return dict(await asyncio.gather(*(one(i, n) for i, n in enumerate(names))))


@dataclass
class Replica:
    """One `inference serve` process with its metrics port and adapter cache."""

    child: procs.Child
    metrics_port: int
    cache_dir: Path
    started: float

    @property
    def address(self) -> str:
        return self.child.address

    async def samples(self) -> list[Sample]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        return parse_metrics(await asyncio.to_thread(_get, url))

    async def downloads(self) -> float:
        return metric(await self.samples(), DOWNLOADS)

    def rss_mib(self) -> float:
        """RSS of the server and its engine-core process, summed."""
        return procs.tree_memory(self.child.process.pid)[0]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        text: str = response.read().decode()
    return text


@dataclass
class Rig:
    """moto, the two stores, and the replicas started on them."""

    stack: Stack
    cache_size: int
    prefetch: int
    few_store: str = ""
    many_store: str = ""

    async def start_stores(self) -> tuple[grpc.aio.Channel, grpc.aio.Channel]:
        """Starts moto and both stores; returns a channel to each (few, many)."""
        logs = self.stack.logs
        moto, endpoint = await asyncio.to_thread(procs.start_moto, logs, "bench-tiers-many")
        self.stack.children.append(moto)
        client = procs.s3_client(endpoint)
        await asyncio.to_thread(client.create_bucket, Bucket="bench-tiers-few")
        stores = await asyncio.gather(
            procs.start_store(logs, endpoint, "bench-tiers-few", name="store-few"),
            procs.start_store(logs, endpoint, "bench-tiers-many", name="store-many"),
        )
        self.stack.children.extend(stores)
        self.few_store, self.many_store = stores[0].address, stores[1].address
        return (
            grpc.aio.insecure_channel(self.few_store),
            grpc.aio.insecure_channel(self.many_store),
        )

    def argv(self, name: str, store: str, port: int, metrics_port: int) -> list[str]:
        """`inference serve` flags of a replica on `store` (the stack's engine profile)."""
        return [
            *procs.serve_argv(
                name,
                port,
                model=self.stack.model_dir,
                store=store,
                cache_dir=self.stack.work / f"cache-{name}",
                engine=self.stack.profile.engine(ENGINE),
            ),
            f"--metrics-port={metrics_port}",
            f"--adapter-cache-size={self.cache_size}",
            f"--prefetch-adapters={self.prefetch}",
        ]

    def start(self, name: str, store: str) -> Replica:
        """A replica on `store` with an empty adapter cache; wait_serving() it."""
        cache_dir = self.stack.work / f"cache-{name}"
        shutil.rmtree(cache_dir, ignore_errors=True)
        port, metrics_port = free_port(), free_port()
        argv = self.argv(name, store, port, metrics_port)
        started = time.monotonic()
        env = self.stack.profile.env
        child = procs.start_inference(self.stack.logs, name, argv, f"127.0.0.1:{port}", env)
        self.stack.children.append(child)
        return Replica(child, metrics_port, cache_dir, started)

    async def serving(self, replica: Replica) -> float:
        """Waits for SERVING; returns the seconds since the process was started."""
        await procs.wait_serving(replica.child, self.stack.logs, SERVING_TIMEOUT_S)
        return time.monotonic() - replica.started

    def stop(self, replica: Replica) -> None:
        replica.child.stop()
        self.stack.children.remove(replica.child)
        shutil.rmtree(replica.cache_dir, ignore_errors=True)
