"""Benchmark 6: the adapter store. Push and download of a 200 MB adapter through
`adapterstore serve` (real gRPC; moto's S3 server over HTTP in its own process) vs raw
boto3 upload_file/download_file on the same endpoint, the store's peak RSS during the
push, and event delivery latency to 50 concurrent watchers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from safetensors.numpy import save_file

from bench import procs, storeops
from bench.report import Report, Section
from bench.stats import median, percentile, ratio
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.clients.push import new_idempotency_key
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.security import ClientSecurity
from loraserve.inference.cache import AdapterCache
from loraserve.testing.adapterfiles import lora_config, lora_tensors

BUCKET = "bench-store"
# 24 layers x 4 projections x rank 64 x hidden 4096, fp32: 192 MiB of LoRA weights,
# the size of a rank-64 adapter of a 7B model's attention.
BIG_SHAPE = {"layers": 24, "rank": 64, "hidden": 4096}
BIG_MODULES = ("k_proj", "o_proj", "q_proj", "v_proj")
REPEATS = 3
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


async def _timed(coro: Any) -> float:
    started = time.perf_counter()
    await coro
    return time.perf_counter() - started


async def _grpc_download(store_address: str, name: str, revision: int) -> float:
    cache_root = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    client = StoreClient.connect(
        StoreClientSettings(address=store_address, security=ClientSecurity(), replica_id="bench")
    )
    try:
        cache = AdapterCache(cache_root, client)
        await cache.prepare()
        return await _timed(cache.fetch(name, revision))
    finally:
        await client.close()
        shutil.rmtree(cache_root, ignore_errors=True)


def _boto_upload(s3: Any, directory: Path, prefix: str) -> None:
    for path in sorted(directory.iterdir()):
        s3.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")


def _diagnose_push(s3: Any, adapter: Path) -> Any:
    """Times, with plain boto3, the S3 upload a store push makes (its part size and
    parts in flight), next to the boto3 arm's default upload_file."""
    from boto3.s3.transfer import TransferConfig

    from loraserve.adapterstore.s3blobs import DEFAULT_PART_SIZE, DEFAULT_PARTS_IN_FLIGHT

    weights = adapter / "adapter_model.safetensors"

    def run() -> dict[str, float]:
        out: dict[str, float] = {}
        started = time.perf_counter()
        s3.upload_file(
            str(weights),
            BUCKET,
            "diag/store-like",
            Config=TransferConfig(
                max_concurrency=DEFAULT_PARTS_IN_FLIGHT, multipart_chunksize=DEFAULT_PART_SIZE
            ),
        )
        label = (
            f"upload, {DEFAULT_PARTS_IN_FLIGHT} parts of {DEFAULT_PART_SIZE // 2**20} MiB "
            "in flight (the store's upload)"
        )
        out[label] = time.perf_counter() - started
        started = time.perf_counter()
        s3.upload_file(str(weights), BUCKET, "diag/adapter_model.safetensors")
        out["upload_file, default 10 threads (boto3 arm)"] = time.perf_counter() - started
        label = "download_file, default 10 threads of ranged GETs (not an arm)"
        out[label] = _boto_download_file(s3, "diag")
        return out

    return asyncio.to_thread(run)


# The store reads each blob with one streamed GET in chunks of this size.
STREAM_CHUNK = 1024 * 1024


def _boto_download(s3: Any, prefix: str) -> None:
    """What the store does per file, with plain boto3: one streamed `get_object` on one
    connection, written to disk chunk by chunk."""
    target = Path(tempfile.mkdtemp(prefix="bench-boto-"))
    try:
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            body = s3.get_object(Bucket=BUCKET, Key=f"{prefix}/{name}")["Body"]
            with (target / name).open("wb") as out:
                for chunk in body.iter_chunks(STREAM_CHUNK):
                    out.write(chunk)
    finally:
        shutil.rmtree(target, ignore_errors=True)


def _boto_download_file(s3: Any, prefix: str) -> float:
    """boto3's download_file with its default TransferConfig (10 threads of 8 MiB
    ranged GETs), timed: the old comparison, kept to show what the emulator distorts."""
    target = Path(tempfile.mkdtemp(prefix="bench-boto-"))
    started = time.perf_counter()
    try:
        s3.download_file(BUCKET, f"{prefix}/adapter_model.safetensors", str(target / "w"))
        return time.perf_counter() - started
    finally:
        shutil.rmtree(target, ignore_errors=True)


@dataclass
class Transfers:
    """Every repeat of the transfer arms: seconds by arm, the push's hashing, and the
    store's RSS before and at its peak during each push."""

    times: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in ("push", "upload", "download", "boto_down")}
    )
    hash_s: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    base_rss: list[float] = field(default_factory=list)


async def _transfers(
    section: Section, settings: StoreSettings, store: procs.Child, s3: Any, work: Path
) -> None:
    adapter = work / "big"
    size = await asyncio.to_thread(write_big_adapter, adapter)
    total = sum(p.stat().st_size for p in adapter.iterdir())
    section.workload.append(
        f"transfer: one adapter of {total / 1e6:.0f} MB ({size / 1e6:.0f} MB safetensors: "
        f"{BIG_SHAPE['layers']} layers x {len(BIG_MODULES)} projections, rank "
        f"{BIG_SHAPE['rank']}, hidden {BIG_SHAPE['hidden']}, fp32), new bytes every repeat, "
        f"{settings.repeats} repeats, arms alternated; push = what adapterctl push does "
        "(sha256 of the files, then the streaming upload), download = the inference "
        "service's AdapterCache.fetch (stream, sha256, fsync, rename); boto3 upload = "
        "upload_file, default TransferConfig; boto3 download = one streamed get_object "
        "per file, as the store reads S3 (like with like: one connection, one GET)"
    )
    measured = Transfers()
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = storeops.store_stub(channel)
        for rep in range(settings.repeats):
            await _transfer_repeat(measured, rep, stub, store, s3, adapter)
    diagnosis = await _diagnose_push(s3, adapter)
    _transfer_report(section, settings, measured, total / 1e6)
    for arm, values in measured.times.items():
        section.record_values(arm, "seconds", values)
    section.record_values("push: adapterctl's hashing", "seconds", measured.hash_s)
    section.table(
        "Where a push's time goes: the store's S3 upload replayed with boto3, and boto3's "
        "download_file on the emulator (seconds)",
        ["phase", "seconds"],
        [[k, v] for k, v in diagnosis.items()],
    )
    _transfer_notes(section, measured, total / 1e6)


async def _transfer_repeat(
    measured: Transfers, rep: int, stub: Any, store: procs.Child, s3: Any, adapter: Path
) -> None:
    """One repeat of the four transfer arms on new bytes, pairs alternated by `rep`."""
    times = measured.times
    name = f"big-{rep}"
    await asyncio.to_thread(write_big_adapter, adapter, rep + 1)

    async def grpc_push() -> int:
        with PeakRss(store) as peak:
            # adapterctl push hashes the files, then uploads them: both count.
            started = time.perf_counter()
            files = await storeops.hashed(adapter)
            measured.hash_s.append(time.perf_counter() - started)
            revision = await storeops.push(stub, name, files)
            times["push"].append(time.perf_counter() - started)
        measured.peaks.append(peak.peak_mib)
        measured.base_rss.append(peak.before_mib)
        return revision

    async def boto_up() -> None:
        times["upload"].append(
            await _timed(asyncio.to_thread(_boto_upload, s3, adapter, f"raw/{rep}"))
        )

    # Alternate which arm goes first, so drift in the machine's load hits both.
    if rep % 2 == 0:
        revision = await grpc_push()
        await boto_up()
    else:
        await boto_up()
        revision = await grpc_push()
    down = _grpc_download(store.address, name, revision)
    boto_down = asyncio.to_thread(_boto_download, s3, f"raw/{rep}")
    if rep % 2 == 0:
        times["download"].append(await down)
        times["boto_down"].append(await _timed(boto_down))
    else:
        times["boto_down"].append(await _timed(boto_down))
        times["download"].append(await down)


def _transfer_report(
    section: Section, settings: StoreSettings, measured: Transfers, mb: float
) -> None:
    times = measured.times
    rows: list[list[str | int | float]] = []
    for label, ours, raw in (
        ("push / upload", "push", "upload"),
        ("download", "download", "boto_down"),
    ):
        ours_s, raw_s = median(times[ours]), median(times[raw])
        rows.append([label, ours_s, mb / ours_s, raw_s, mb / raw_s, ratio(raw_s, ours_s)])
    section.table(
        "Transfer of one 200 MB adapter (medians; ratio = boto3 time / loraserve time)",
        ["operation", "loraserve s", "loraserve MB/s", "boto3 s", "boto3 MB/s", "ratio"],
        rows,
    )
    section.table(
        "Every repeat (seconds)",
        ["arm"] + [f"rep {i + 1}" for i in range(settings.repeats)],
        [[k, *v] for k, v in times.items()],
    )
    push_ratio = ratio(median(times["upload"]), median(times["push"]))
    down_ratio = ratio(median(times["boto_down"]), median(times["download"]))
    section.goal(
        "push throughput vs boto3 upload_file", push_ratio, ">= 0.8", push_ratio >= 0.8, ".2f"
    )
    section.goal(
        "download throughput vs boto3 streamed get_object",
        down_ratio,
        ">= 0.8",
        down_ratio >= 0.8,
        ".2f",
    )
    peak = max(measured.peaks)
    section.goal(
        "store peak RSS during a 200 MB push",
        peak,
        f"bounded (idle {median(measured.base_rss):.0f} MiB)",
        peak - median(measured.base_rss) < mb / 2,
        ".0f",
    )


def _transfer_notes(section: Section, measured: Transfers, mb: float) -> None:
    section.notes.append(
        "A push with declared sha256s (adapterctl always declares them) streams each file "
        "as a multipart upload straight to blobs/sha256/<hex>, several parts in flight while "
        "the next ones arrive, and completes it only once the whole push has validated; "
        "the bytes cross S3 once. What a push adds over the replay above is the gRPC hop "
        "through the store process (see bench/README.md)."
    )
    section.notes.append(
        f"The push time includes adapterctl's hashing: {median(measured.hash_s):.2f} s for "
        f"{mb:.0f} MB (boto3's upload_file computes its own checksums inline)."
    )
    section.notes.append(
        "moto (the S3 emulator) re-reads the whole object for every ranged GET, so "
        "download_file's 10 threads of 8 MiB ranges cost it about 25 whole-object reads "
        "for 200 MB; on real S3 ranged GETs are cheap and parallel ranges are faster than "
        "one stream. The download ratio therefore compares one streamed GET with one "
        "streamed GET; download_file's time on the emulator is in the table above, for "
        "reference only."
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
    section.goal(
        "event delivery p99, 50 watchers (ms)", p99, "< 100", p99 < 100 and not missing, ".1f"
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
