"""Benchmark 15 (profile real): a fleet cold start. N processes, each a replica's real
`AdapterCache` (bench.real.fleet_fetch), fetch the same adapters from the store at once,
against N processes reading the same objects with one streamed boto3 get_object each,
on the same S3 (moto). Per arm run: aggregate bytes/s (all bytes / from the go to the
last process's end), the store process's CPU seconds and its RSS peak; every process
is started and ready before the go, so interpreter start-up is not timed."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.method.cpu import cpu_seconds
from bench.method.paired import AGAIN, rotated
from bench.method.report import Cell, Section
from bench.method.stats import median_interval, paired_ratio
from bench.rig import procs
from bench.store.transfers import PeakRss
from loraserve.adapterstore.blobs.blobstore import blob_key

CACHES = "replica caches (from the store)"
BOTO = "boto3 get_object (straight from S3)"
GOAL = 0.9


@dataclass(frozen=True)
class Fleet:
    """What the fetchers read: `adapters` (NAME@REV) through the store, or the same
    blobs as `keys` in `bucket` straight from S3."""

    store: procs.Child
    endpoint: str
    bucket: str
    adapters: tuple[str, ...]
    keys: tuple[str, ...]
    processes: int


@dataclass
class FleetRun:
    seconds: float
    bytes: int
    store_cpu_s: float
    store_peak_mib: float
    store_idle_mib: float

    @property
    def bytes_per_s(self) -> float:
        return self.bytes / self.seconds


@dataclass
class FleetRuns:
    runs: dict[str, list[FleetRun]] = field(default_factory=dict)


def fetch_argv(
    arm: str, store: str, adapters: Sequence[str], endpoint: str, bucket: str, keys: Sequence[str]
) -> list[str]:
    """One fetcher's command line for `arm` (CACHES or BOTO)."""
    command = [sys.executable, "-m", "bench.real.fleet_fetch"]
    if arm == CACHES:
        return [*command, "cache", f"--store={store}", *(f"--adapter={a}" for a in adapters)]
    return [
        *command,
        "boto3",
        f"--s3={endpoint}",
        f"--bucket={bucket}",
        *(f"--key={k}" for k in keys),
    ]


def _argv(fleet: Fleet, arm: str) -> list[str]:
    return fetch_argv(
        arm, fleet.store.address, fleet.adapters, fleet.endpoint, fleet.bucket, fleet.keys
    )


async def _start(argv: Sequence[str], log: Path) -> asyncio.subprocess.Process:
    with log.open("ab") as err:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err
        )
    assert process.stdout is not None
    if (await process.stdout.readline()).strip() != b"ready":
        raise RuntimeError(f"a fetcher did not start: see {log}")
    return process


async def one_run(fleet: Fleet, arm: str, logs: Path) -> FleetRun:
    """Every fetcher started and ready, then all go at once."""
    argv = _argv(fleet, arm.removesuffix(AGAIN))
    workers = await asyncio.gather(
        *(_start(argv, logs / "fleet-fetch.log") for _ in range(fleet.processes))
    )
    store_pid = fleet.store.process.pid
    with PeakRss(fleet.store) as peak:
        cpu_before = cpu_seconds(store_pid)
        go = time.monotonic()
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
        replies = [json.loads((await w.communicate())[0]) for w in workers]
        cpu = cpu_seconds(store_pid) - cpu_before
    failed = [w.returncode for w in workers if w.returncode]
    if failed:
        raise RuntimeError(
            f"{len(failed)} fetchers of {arm} failed: see {logs / 'fleet-fetch.log'}"
        )
    return FleetRun(
        seconds=max(r["ended"] for r in replies) - go,
        bytes=sum(r["bytes"] for r in replies),
        store_cpu_s=cpu,
        store_peak_mib=peak.peak_mib,
        store_idle_mib=peak.before_mib,
    )


async def measure(fleet: Fleet, repeats: int, logs: Path) -> FleetRuns:
    """The arms alternated, the boto3 arm twice per repeat (the noise)."""
    measured = FleetRuns({arm: [] for arm in (CACHES, BOTO, BOTO + AGAIN)})
    for rep in range(repeats):
        for arm in rotated(list(measured.runs), rep):
            measured.runs[arm].append(await one_run(fleet, arm, logs))
    return measured


def figures(section: Section, fleet: Fleet, measured: FleetRuns) -> None:
    rows: list[list[Cell]] = []
    for arm, runs in measured.runs.items():
        section.record(
            arm,
            [
                {
                    "seconds": r.seconds,
                    "bytes": r.bytes,
                    "store_cpu_s": r.store_cpu_s,
                    "store_peak_mib": r.store_peak_mib,
                }
                for r in runs
            ],
        )
        rows.append(
            [
                arm,
                median_interval([r.bytes_per_s / 1e6 for r in runs]).text(".0f"),
                median_interval([r.store_cpu_s for r in runs]).text(".1f"),
                median_interval([r.store_peak_mib for r in runs]).text(".0f"),
            ]
        )
    section.table(
        f"{fleet.processes} processes fetching {len(fleet.adapters)} adapters each "
        "(median [interval] over repeats)",
        ["arm", "aggregate MB/s", "store CPU s", "store RSS peak MiB"],
        rows,
    )
    speed = {arm: [r.bytes_per_s for r in runs] for arm, runs in measured.runs.items()}
    section.goal(
        f"{fleet.processes} replica caches / {fleet.processes} boto3 readers, aggregate bytes/s",
        paired_ratio(speed[CACHES], speed[BOTO]),
        ">=",
        GOAL,
        ".2f",
        metric="bytes_per_s",
    )
    section.noise(
        "boto3 readers measured twice",
        paired_ratio(speed[BOTO], speed[BOTO + AGAIN]),
        "bytes_per_s",
    )
    caches = measured.runs[CACHES]
    section.reported(
        "store CPU seconds per GB the caches read",
        median_interval([r.store_cpu_s / (r.bytes / 1e9) for r in caches]),
        ".2f",
        note="reported (issue 24: <= 5 % of this figure before the direct S3 path)",
    )
    section.reported(
        "store RSS peak while the caches read (MiB)",
        median_interval([r.store_peak_mib for r in caches]),
        ".0f",
    )


def blob_keys(manifest_files: Sequence[tuple[str, str]]) -> tuple[str, ...]:
    """The S3 keys of the blobs (`sha256` of each file) a revision's files live at."""
    return tuple(blob_key(sha) for _, sha in manifest_files)
