"""Benchmark 6: the adapter store. Push and download of a 200 MB adapter through
`adapterstore serve` (real gRPC; moto's S3 server over HTTP in its own process) vs plain
boto3 on the same endpoint (bench.store.transfers: arms paired per repeat, the store's CPU
per GB read and its RSS during a push), and event delivery latency to 50 concurrent
watchers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from safetensors.numpy import save_file

from bench.method.report import Report, Section
from bench.method.stats import median, percentile, unpaired_ratio
from bench.rig import procs, storeops
from bench.store import transfers
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.clients.push import new_idempotency_key
from loraserve.testing.adapters.files import lora_config, lora_tensors

BUCKET = "bench-store"
# 24 layers x 4 projections x rank 64 x hidden 4096, fp32: 192 MiB of LoRA weights,
# the size of a rank-64 adapter of a 7B model's attention.
BIG_SHAPE = {"layers": 24, "rank": 64, "hidden": 4096}
BIG_MODULES = ("k_proj", "o_proj", "q_proj", "v_proj")
REPEATS = 5
WATCHERS = 50
EVENTS = 20
EVENT_GAP_S = 0.15


@dataclass(frozen=True)
class StoreSettings:
    repeats: int = REPEATS
    watchers: int = WATCHERS
    events: int = EVENTS


def write_big_adapter(directory: Path, variant: int = 0) -> int:
    """Writes a valid PEFT LoRA adapter of ~200 MB; returns its weights' size. Each
    variant has different bytes, so the store cannot skip the upload as a duplicate."""
    directory.mkdir(parents=True, exist_ok=True)
    rank = BIG_SHAPE["rank"]
    tensors = lora_tensors(
        rank=rank, modules=BIG_MODULES, layers=BIG_SHAPE["layers"], hidden=BIG_SHAPE["hidden"]
    )
    first = next(iter(tensors.values()))
    first[0, 0] = variant
    weights = directory / "adapter_model.safetensors"
    save_file(tensors, str(weights))
    (directory / "adapter_config.json").write_bytes(lora_config(rank, BIG_MODULES))
    return weights.stat().st_size


async def _transfers(
    section: Section, settings: StoreSettings, store: procs.Child, s3: Any, work: Path
) -> None:
    async def write(rep: int, directory: Path) -> Path:
        await asyncio.to_thread(write_big_adapter, directory, rep + 1)
        return directory

    rig = transfers.Rig(store, s3, BUCKET, work)
    measured = await transfers.measure(rig, settings.repeats, write)
    section.workload.append(
        f"transfer: one adapter of {measured.megabytes:.0f} MB ({BIG_SHAPE['layers']} layers "
        f"x {len(BIG_MODULES)} projections, rank {BIG_SHAPE['rank']}, hidden "
        f"{BIG_SHAPE['hidden']}, fp32), new bytes every repeat, {settings.repeats} repeats, "
        "arms rotated; " + TRANSFER_ARMS
    )
    transfers.figures(section, measured)


TRANSFER_ARMS = (
    "push = what adapterctl push does (sha256 of the files, then the streaming upload) vs "
    "boto3 upload_file (default TransferConfig), twice (noise); replica download = the "
    "inference service's AdapterCache.fetch (stream, sha256, fsync, rename) vs one "
    "streamed get_object per file, as the store reads S3 (moto re-reads a whole object "
    "for every ranged GET, so boto3's parallel download_file is no baseline on it)"
)


async def _watch(
    stub: Any, after_seq: int, arrivals: dict[int, float], ready: asyncio.Event
) -> None:
    call = stub.WatchAdapters(store_pb.WatchAdaptersRequest(after_seq=after_seq))
    ready.set()
    async for message in call:
        if message.HasField("event"):
            event = message.event
            arrivals[event.seq] = time.time() - event.time.ToDatetime().timestamp()


async def _events(
    section: Section, settings: StoreSettings, store: procs.Child, work: Path
) -> None:
    small = work / "small"
    small.mkdir()
    (small / "adapter_config.json").write_bytes(lora_config(4))
    save_file(lora_tensors(4), str(small / "adapter_model.safetensors"))
    files = await storeops.hashed(small)
    async with grpc.aio.insecure_channel(store.address) as writer:
        stub = storeops.store_stub(writer)
        await storeops.push(stub, "evt", files)
        await storeops.push(stub, "evt", files)
        head = (await stub.ListAdapters(store_pb.ListAdaptersRequest())).seq
        channels = [grpc.aio.insecure_channel(store.address) for _ in range(settings.watchers)]
        arrivals: list[dict[int, float]] = [{} for _ in channels]
        ready = [asyncio.Event() for _ in channels]
        tasks = [
            asyncio.create_task(_watch(storeops.store_stub(ch), head, arr, ev))
            for ch, arr, ev in zip(channels, arrivals, ready, strict=True)
        ]
        await asyncio.gather(*(ev.wait() for ev in ready))
        await asyncio.sleep(0.5)
        seqs, commit_s = await _commit_events(stub, settings.events)
        await asyncio.sleep(1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for ch in channels:
            await ch.close()
    _events_report(section, settings, arrivals, seqs, commit_s)


async def _commit_events(stub: Any, events: int) -> tuple[list[int], list[float]]:
    """`events` SetCurrentRevision commits EVENT_GAP_S apart: their seqs, and the
    seconds each commit took the writer."""
    commit_s: list[float] = []
    seqs: list[int] = []
    for i in range(events):
        started = time.perf_counter()
        response = await stub.SetCurrentRevision(
            store_pb.SetCurrentRevisionRequest(
                name="evt", revision=1 + i % 2, idempotency_key=new_idempotency_key()
            )
        )
        commit_s.append(time.perf_counter() - started)
        seqs.append(response.seq)
        await asyncio.sleep(EVENT_GAP_S)
    return seqs, commit_s


def _events_report(
    section: Section,
    settings: StoreSettings,
    arrivals: list[dict[int, float]],
    seqs: list[int],
    commit_s: list[float],
) -> None:
    latencies = [a[s] * 1000 for a in arrivals for s in seqs if s in a]
    missing = len(seqs) * len(arrivals) - len(latencies)
    section.workload.append(
        f"events: {settings.watchers} concurrent WatchAdapters streams (one channel each, one "
        f"client process), {settings.events} SetCurrentRevision commits {EVENT_GAP_S} s apart; "
        "latency = arrival at the watcher - the event's commit timestamp (taken before the "
        "log object is written, so it includes the S3 commit)"
    )
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    per_event = [percentile([a[seq] * 1000 for a in arrivals if seq in a], 99) for seq in seqs]
    section.table(
        "Event delivery to 50 watchers (ms)",
        ["deliveries", "missing", "p50", "p90", "p99", "max", "writer commit p50"],
        [
            [
                len(latencies),
                missing,
                p50,
                percentile(latencies, 90),
                p99,
                max(latencies, default=float("nan")),
                median(commit_s) * 1000,
            ]
        ],
    )
    # An event is a repeat: its commit, and its delivery to every watcher.
    section.record(
        "events",
        [
            {
                "commit_s": commit,
                "deliveries": sum(seq in a for a in arrivals),
                "delivery_p50_ms": percentile([a[seq] * 1000 for a in arrivals if seq in a], 50),
                "delivery_max_ms": max(
                    (a[seq] * 1000 for a in arrivals if seq in a), default=float("nan")
                ),
            }
            for seq, commit in zip(seqs, commit_s, strict=True)
        ],
    )
    section.check(
        f"event delivery p99 over {len(latencies)} deliveries to 50 watchers (ms), none missing",
        p99,
        "< 100",
        p99 < 100 and not missing,
        ".1f",
    )
    section.noise(
        "per-event delivery p99, odd / even events",
        unpaired_ratio(per_event[1::2], per_event[::2]),
        "delivery_ms",
    )


async def run(report: Report, settings: StoreSettings = StoreSettings()) -> None:
    section = report.section(6, "Adapter store: transfers and event delivery")
    started = time.monotonic()
    logs = report.results_dir / "logs"
    work = Path(tempfile.mkdtemp(prefix="bench-store-"))
    moto, endpoint = await asyncio.to_thread(procs.start_moto, logs, BUCKET)
    store: procs.Child | None = None
    try:
        store = await procs.start_store(logs, endpoint, BUCKET)
        s3 = procs.s3_client(endpoint)
        await _transfers(section, settings, store, s3, work)
        await _events(section, settings, store, work)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if store is not None:
            store.stop()
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
        section.seconds = time.monotonic() - started
        report.print_section(section)
