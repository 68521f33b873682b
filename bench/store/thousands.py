"""Benchmark 12: the adapter store at 10,000 adapters.

Two `adapterstore serve` processes on one moto S3 server (its own process), each on
its own bucket: one holding 10 adapters, one holding 10,000, seeded through the real
PushAdapter RPC (a tiny valid PEFT adapter; identical bytes under every name, so the
blobs are stored once and the log, the snapshots and the state hold 10,000 adapters).
Side by side in one run:

- pushes/s of sequential pushes (new revisions, hashing done once beforehand) to the
  store with 10,000 adapters ÷ to the store with 10, rounds interleaved and their
  order alternated, every round kept;
- the whole listing of the large store as an inference replica reads it
  (`StoreClient.list_adapters`: every page of 500), every repeat kept;
- a restart of each store: process start → grpc.health SERVING, every repeat kept.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from safetensors.numpy import save_file

from bench.method.paired import rotated
from bench.method.report import Report, Section
from bench.method.stats import median, median_interval, paired_ratio
from bench.rig import procs, storeops
from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.rpc.security import ClientSecurity
from loraserve.testing.adapters.files import lora_config, lora_tensors

NUMBER = 12
SMALL_BUCKET = "bench-scale-small"
LARGE_BUCKET = "bench-scale-large"
LIST_GOAL_S = 1.0
RESTART_GOAL_S = 5.0
PUSH_RATIO_GOAL = 0.9


@dataclass(frozen=True)
class ScaleSettings:
    adapters: int = 10_000
    small: int = 10
    seed_concurrency: int = 32
    push_rounds: int = 6
    pushes_per_round: int = 50
    list_repeats: int = 5
    restarts: int = 5


QUICK = ScaleSettings(
    adapters=1_000, push_rounds=2, pushes_per_round=20, list_repeats=2, restarts=1
)


@dataclass
class Measured:
    """Every repeat: pushes/s by arm ("small", "large"), listing and restart seconds."""

    pushes_per_s: dict[str, list[float]] = field(
        default_factory=lambda: {"small": [], "large": [], "small again": []}
    )
    list_s: list[float] = field(default_factory=list)
    restart_s: dict[str, list[float]] = field(default_factory=lambda: {"small": [], "large": []})


def adapters_label(count: int) -> str:
    return f"{count:,} adapters"


def report_goals(section: Section, measured: Measured, adapters: int) -> None:
    """The three figures against their goals, computed from every repeat measured."""
    label = adapters_label(adapters)
    section.goal(
        f"store ListAdapters, {label} (s)",
        median_interval(measured.list_s),
        "<=",
        LIST_GOAL_S,
        ".3f",
    )
    section.goal(
        f"store restart with {label} → SERVING (s)",
        median_interval(measured.restart_s["large"]),
        "<=",
        RESTART_GOAL_S,
        ".2f",
    )
    per_s = measured.pushes_per_s
    section.goal(
        f"push with {adapters:,} ÷ push with 10 (pushes/s, rounds paired)",
        paired_ratio(per_s["large"], per_s["small"]),
        ">=",
        PUSH_RATIO_GOAL,
        ".2f",
        metric="pushes_per_s",
    )
    if per_s["small again"]:
        section.noise(
            "pushes/s to the store with 10, measured twice per round",
            paired_ratio(per_s["small"], per_s["small again"]),
            "pushes_per_s",
        )


def _write_adapter(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "adapter_config.json").write_bytes(lora_config(4))
    save_file(lora_tensors(4), str(directory / "adapter_model.safetensors"))


def _name(i: int) -> str:
    return f"a{i:05d}"


async def _seed(address: str, files: AdapterFiles, count: int, concurrency: int) -> float:
    """Pushes adapters a00000.. through PushAdapter, `concurrency` at a time; seconds taken."""
    names = iter(range(count))
    started = time.perf_counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = storeops.store_stub(channel)

        async def worker() -> None:
            for i in names:
                await storeops.push(stub, _name(i), files)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def _push_rounds(
    measured: Measured, settings: ScaleSettings, stores: dict[str, str], files: AdapterFiles
) -> None:
    async def one_round(arm: str) -> None:
        async with grpc.aio.insecure_channel(stores[arm.removesuffix(" again")]) as channel:
            stub = storeops.store_stub(channel)
            started = time.perf_counter()
            for i in range(settings.pushes_per_round):
                await storeops.push(stub, _name(i % settings.small), files)
            seconds = time.perf_counter() - started
        measured.pushes_per_s[arm].append(settings.pushes_per_round / seconds)

    for rep in range(settings.push_rounds):
        # Rotate which store goes first, so drift in the machine's load hits both.
        for arm in rotated(["small", "large", "small again"], rep):
            await one_round(arm)


async def _listings(measured: Measured, settings: ScaleSettings, address: str) -> None:
    client = StoreClient.connect(
        StoreClientSettings(address=address, security=ClientSecurity(), replica_id="bench")
    )
    try:
        for _ in range(settings.list_repeats):
            started = time.perf_counter()
            listing = await client.list_adapters()
            measured.list_s.append(time.perf_counter() - started)
            if len(listing.adapters) != settings.adapters:
                raise RuntimeError(
                    f"listed {len(listing.adapters)} adapters, expected {settings.adapters}"
                )
    finally:
        await client.close()


async def _restart(logs: Path, endpoint: str, bucket: str, store: procs.Child) -> procs.Child:
    """Stops `store` and starts it again on `bucket`; the new child."""
    await asyncio.to_thread(store.stop)
    return await procs.start_store(logs, endpoint, bucket, name=store.name)


def _tables(section: Section, settings: ScaleSettings, measured: Measured) -> None:
    small, large = f"{settings.small} adapters", adapters_label(settings.adapters)
    section.table(
        "Pushes/s, sequential pushes of new revisions (every round, interleaved)",
        ["store", "median", *[f"round {i + 1}" for i in range(settings.push_rounds)]],
        [
            [label, median(measured.pushes_per_s[arm]), *measured.pushes_per_s[arm]]
            for arm, label in (
                ("small", small),
                ("large", large),
                ("small again", small + " again"),
            )
        ],
    )
    section.table(
        "Restart: process start → SERVING (seconds, every repeat)",
        ["store", "median", *[f"rep {i + 1}" for i in range(settings.restarts)]],
        [
            [label, median(measured.restart_s[arm]), *measured.restart_s[arm]]
            for arm, label in (("small", small), ("large", large))
        ],
    )
    section.table(
        f"The whole listing of {large} (every page of 500; seconds, every repeat)",
        ["median", *[f"rep {i + 1}" for i in range(settings.list_repeats)]],
        [[median(measured.list_s), *measured.list_s]],
    )
    for arm, values in measured.pushes_per_s.items():
        section.record_values(f"push {arm}", "pushes_per_s", values)
    for arm in ("small", "large"):
        section.record_values(f"restart {arm}", "seconds", measured.restart_s[arm])
    section.record_values("list large", "seconds", measured.list_s)


async def _measure(
    section: Section, settings: ScaleSettings, logs: Path, work: Path, endpoint: str
) -> None:
    adapter = work / "adapter"
    _write_adapter(adapter)
    files = await storeops.hashed(adapter)
    buckets = {"small": SMALL_BUCKET, "large": LARGE_BUCKET}
    children: dict[str, procs.Child] = {}
    try:
        for arm, bucket in buckets.items():
            children[arm] = await procs.start_store(logs, endpoint, bucket, name=f"store-{arm}")
        await _seed(children["small"].address, files, settings.small, 1)
        seed_s = await _seed(
            children["large"].address, files, settings.adapters, settings.seed_concurrency
        )
        section.notes.append(
            f"seeding {settings.adapters:,} adapters through PushAdapter, "
            f"{settings.seed_concurrency} at a time: {seed_s:.0f} s "
            f"({settings.adapters / seed_s:.0f} pushes/s)"
        )
        measured = Measured()
        addresses = {arm: child.address for arm, child in children.items()}
        await _push_rounds(measured, settings, addresses, files)
        await _listings(measured, settings, children["large"].address)
        for _ in range(settings.restarts):
            for arm in ("small", "large"):
                started = time.perf_counter()
                children[arm] = await _restart(logs, endpoint, buckets[arm], children[arm])
                measured.restart_s[arm].append(time.perf_counter() - started)
    finally:
        for child in children.values():
            child.stop()
    _tables(section, settings, measured)
    report_goals(section, measured, settings.adapters)


async def run(report: Report, *, quick: bool, settings: ScaleSettings | None = None) -> None:
    """Benchmark 12."""
    settings = settings or (QUICK if quick else ScaleSettings())
    section = report.section(NUMBER, f"The adapter store at {adapters_label(settings.adapters)}")
    section.workload.append(
        f"two stores on one moto S3 process: {settings.small} adapters and "
        f"{settings.adapters:,} (tiny PEFT adapter, rank 4, identical bytes under every "
        f"name); {settings.push_rounds} rounds of {settings.pushes_per_round} sequential "
        "pushes per store, interleaved; the whole listing as an inference replica reads it "
        f"(pages of 500), {settings.list_repeats} times; {settings.restarts} restarts of "
        "each store (SIGTERM, then process start → SERVING)"
        + (" — quick run: fewer adapters than the goal's 10,000" if quick else "")
    )
    logs = report.results_dir / "logs"
    async with procs.moto_section(report, section, LARGE_BUCKET, "bench-scale-") as (
        endpoint,
        work,
    ):
        await asyncio.to_thread(procs.s3_client(endpoint).create_bucket, Bucket=SMALL_BUCKET)
        await _measure(section, settings, logs, work, endpoint)
