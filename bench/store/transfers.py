"""Adapter bytes through the store against plain boto3 on the same S3 (moto's server,
its own process), arms paired per repeat with new bytes every repeat:

- push: what `adapterctl push` does (sha256 of the files, then the streaming upload)
  vs boto3 `upload_file` (default TransferConfig), measured twice (the noise arm);
- download: the inference service's `AdapterCache.fetch` (stream, sha256, fsync,
  rename) vs one streamed `get_object` per file, as the store reads S3 (like with
  like: one connection, one GET each; moto re-reads a whole object for every ranged
  GET, so boto3's parallel download_file is no fair baseline on the emulator);
- the store process's CPU seconds while replicas download, per GB read, and its RSS
  peak while a push streams through it.

Issue 24's goals: download and push each >= 0.9x boto3's.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bench.method.cpu import cpu_seconds
from bench.method.paired import rotated
from bench.method.report import Cell, Section
from bench.method.stats import median, median_interval, paired_ratio
from bench.rig import procs, storeops
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.cache import AdapterCache

GOAL = 0.9
# The store reads each blob with one streamed GET in chunks of this size.
STREAM_CHUNK = 1024 * 1024
PUSH_ARMS = ("push", "boto3 upload_file", "boto3 upload_file (again)")
DOWNLOAD_ARMS = ("replica download", "boto3 get_object")

# Writes an adapter with new bytes for repeat N into a directory; returns it.
Writer = Callable[[int, Path], Awaitable[Path]]


class PeakRss:
    """Samples a process tree's RSS every 20 ms in a thread, keeping the peak."""

    def __init__(self, child: procs.Child) -> None:
        self._child = child
        self.peak_mib = 0.0
        self.before_mib = child.memory()[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_mib = max(self.peak_mib, self._child.memory()[0])
            self._stop.wait(0.02)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Transfers:
    """Every repeat: seconds by arm, the push's hashing, the store's RSS before and at
    its peak during each push, and its CPU seconds during each replica download."""

    seconds: dict[str, list[float]] = field(
        default_factory=lambda: {arm: [] for arm in (*PUSH_ARMS, *DOWNLOAD_ARMS)}
    )
    hash_s: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    idle_rss: list[float] = field(default_factory=list)
    store_cpu_s: list[float] = field(default_factory=list)
    megabytes: float = 0.0


async def replica_download(store_address: str, name: str, revision: int) -> float:
    """Seconds for a fresh AdapterCache to fetch one revision."""
    cache_root = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    client = StoreClient.connect(
        StoreClientSettings(address=store_address, security=ClientSecurity(), replica_id="bench")
    )
    cache = AdapterCache(cache_root, client)
    try:
        await cache.prepare()
        started = time.perf_counter()
        await cache.fetch(name, revision)
        return time.perf_counter() - started
    finally:
        await cache.close()
        await client.close()
        shutil.rmtree(cache_root, ignore_errors=True)


def adapter_files(directory: Path) -> list[str]:
    """The adapter's files, the builders' dot-files left out."""
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def megabytes(directory: Path) -> float:
    """The adapter files' size (MB), the builders' dot-files left out."""
    return sum(p.stat().st_size for p in directory.iterdir() if not p.name.startswith(".")) / 1e6


def boto_upload(s3: Any, bucket: str, directory: Path, prefix: str) -> float:
    started = time.perf_counter()
    for path in sorted(p for p in directory.iterdir() if not p.name.startswith(".")):
        s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")
    return time.perf_counter() - started


def boto_get(s3: Any, bucket: str, prefix: str, names: list[str], target: Path) -> None:
    """One streamed get_object per file, written into `target` chunk by chunk."""
    for name in names:
        body = s3.get_object(Bucket=bucket, Key=f"{prefix}/{name}")["Body"]
        with (target / name).open("wb") as out:
            for chunk in body.iter_chunks(STREAM_CHUNK):
                out.write(chunk)


def boto_stream(s3: Any, bucket: str, prefix: str, names: list[str]) -> float:
    """`boto_get` into a scratch directory: its seconds."""
    target = Path(tempfile.mkdtemp(prefix="bench-boto-"))
    started = time.perf_counter()
    try:
        boto_get(s3, bucket, prefix, names, target)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(target, ignore_errors=True)


@dataclass
class Rig:
    """Where the transfers run: the store, moto's bucket, a scratch directory."""

    store: procs.Child
    s3: Any
    bucket: str
    work: Path


async def _push_arm(rig: Rig, measured: Transfers, stub: Any, name: str, adapter: Path) -> int:
    with PeakRss(rig.store) as peak:
        # adapterctl push hashes the files, then uploads them: both count.
        started = time.perf_counter()
        files = await storeops.hashed(adapter)
        measured.hash_s.append(time.perf_counter() - started)
        revision = await storeops.push(stub, name, files)
        measured.seconds["push"].append(time.perf_counter() - started)
    measured.peaks.append(peak.peak_mib)
    measured.idle_rss.append(peak.before_mib)
    return revision


async def _repeat(rig: Rig, measured: Transfers, stub: Any, rep: int, adapter: Path) -> None:
    """One repeat of every arm on new bytes, each group's order rotated by `rep`."""
    name = f"big-{rep}"
    revision = 0
    for arm in rotated(PUSH_ARMS, rep):
        if arm == "push":
            revision = await _push_arm(rig, measured, stub, name, adapter)
        else:
            prefix = f"raw/{rep}/{PUSH_ARMS.index(arm)}"
            measured.seconds[arm].append(
                await asyncio.to_thread(boto_upload, rig.s3, rig.bucket, adapter, prefix)
            )
    files = await asyncio.to_thread(adapter_files, adapter)
    for arm in rotated(DOWNLOAD_ARMS, rep):
        if arm == "replica download":
            before = cpu_seconds(rig.store.process.pid)
            seconds = await replica_download(rig.store.address, name, revision)
            measured.store_cpu_s.append(cpu_seconds(rig.store.process.pid) - before)
        else:
            prefix = f"raw/{rep}/{PUSH_ARMS.index('boto3 upload_file')}"
            seconds = await asyncio.to_thread(boto_stream, rig.s3, rig.bucket, prefix, files)
        measured.seconds[arm].append(seconds)


async def measure(rig: Rig, repeats: int, write: Writer) -> Transfers:
    measured = Transfers()
    async with grpc.aio.insecure_channel(rig.store.address) as channel:
        stub = storeops.store_stub(channel)
        for rep in range(repeats):
            adapter = await write(rep, rig.work / f"adapter-{rep}")
            measured.megabytes = await asyncio.to_thread(megabytes, adapter)
            await _repeat(rig, measured, stub, rep, adapter)
            shutil.rmtree(adapter, ignore_errors=True)
    return measured


def figures(section: Section, measured: Transfers, *, rss_check: bool = True) -> None:
    """Tables, goals (issue 24's), noise and the store's CPU and RSS (`rss_check`: the
    peak must stay below half the adapter above idle, which tells a bounded buffer from
    one that grows with the adapter only for adapters well above the store's ~70 MiB of
    buffers)."""
    secs = measured.seconds
    mb = measured.megabytes
    rows: list[list[Cell]] = []
    for arm, values in secs.items():
        section.record_values(arm, "seconds", values)
        rows.append([arm, median_interval(values).text(".2f"), mb / median(values)])
    section.record_values("push: adapterctl's hashing", "seconds", measured.hash_s)
    section.record_values("store CPU during a replica download", "cpu_s", measured.store_cpu_s)
    section.table(
        f"Transfers of one {mb:.0f} MB adapter (seconds: median [interval]; MB/s of the median)",
        ["arm", "seconds", "MB/s"],
        rows,
    )
    # Throughput ratios: boto3's time over loraserve's, repeat by repeat.
    for figure, boto, ours in (
        ("push throughput / boto3 upload_file", "boto3 upload_file", "push"),
        (
            "replica download throughput / boto3 streamed get_object",
            "boto3 get_object",
            "replica download",
        ),
    ):
        section.goal(
            figure,
            paired_ratio(secs[boto], secs[ours]),
            ">=",
            GOAL,
            ".2f",
            metric="transfer_seconds",
        )
    section.noise(
        "boto3 upload_file measured twice",
        paired_ratio(secs["boto3 upload_file"], secs["boto3 upload_file (again)"]),
        "transfer_seconds",
    )
    per_gb = [cpu / (mb / 1000) for cpu in measured.store_cpu_s]
    section.reported(
        "store CPU seconds per GB read by replicas",
        median_interval(per_gb),
        ".2f",
        note="reported (issue 24: <= 5 % of this figure before the direct S3 path)",
    )
    idle = median(measured.idle_rss)
    peak = max(measured.peaks, default=float("nan"))
    figure = f"store peak RSS during a {mb:.0f} MB push (MiB)"
    if rss_check:
        section.check(
            figure,
            peak,
            f"idle ({idle:.0f}) + less than half the adapter",
            peak - idle < mb / 2,
            ".0f",
        )
    else:
        section.reported(figure, peak, ".0f", note=f"reported (idle {idle:.0f})")
    section.notes.append(
        f"The push time includes adapterctl's hashing: {median(measured.hash_s):.2f} s for "
        f"{mb:.0f} MB (boto3's upload_file computes its own checksums inline)."
    )
