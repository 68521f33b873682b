"""Benchmark 21: the S3 client library on both data paths (issue 24, item 3), against
moto's S3 server over HTTP in its own process, on one object of 128 MiB (64 quick),
new bytes for every arm of every repeat, arms paired and rotated per repeat.

- writes, what the store does with a push's bytes: the store's own upload
  (`S3BlobStore`: boto3 in threads, the file hashed in order while multipart parts go
  out, K parts in flight; the whole push path minus gRPC) at K = 4 and K = 10 vs
  obstore's multipart put (Rust, async, K = 10 in flight, the bytes hashed as they
  go) vs boto3 `upload_file` (the transfer manager: 8 MiB parts, 10 threads; the
  baseline, measured twice for the noise); and the design not built, estimated: the
  client's upload_file to a staging key, then the store's read-back (streamed, hashed)
  and copy to the content address;
- reads, what a replica does: the inference cache's `HttpReader` on a presigned URL
  (aiohttp, one streamed GET, written, hashed and fsynced) vs obstore's get (with
  credentials, streamed to a file and hashed) vs one streamed boto3 `get_object` to a
  file (the baseline, twice); and, to say where HttpReader's time goes, the same
  presigned GET with aiohttp alone (written, neither hashed nor fsynced: the transport)
  and boto3's `get_object` doing the replica's checks (hashed as it arrives, fsynced).

Every figure is a paired ratio of throughputs (the baseline's seconds over the arm's)
with its 95 % bootstrap interval; no goal (the goals on the product's paths are
benchmark 6's); the choice it informs is written in docs/design.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from bench.method.paired import rotated
from bench.method.report import Cell, Report, Section
from bench.method.stats import median, median_interval, paired_ratio
from bench.rig import procs
from bench.store import transfers
from loraserve.adapterstore.blobs import S3BlobStore, S3Location, S3Presigner
from loraserve.common.revisions.manifest import FileInfo
from loraserve.inference.cache.http_read import HttpReader, ReadSettings

BUCKET = "bench-s3-libs"
CHUNK = 1024 * 1024
PART = 8 * 1024 * 1024
WIDE = 10  # boto3 TransferConfig's max_concurrency
WRITE_BASE = "boto3 upload_file"
READ_BASE = "boto3 get_object"
WRITE_ARMS = (
    WRITE_BASE,
    f"{WRITE_BASE} (again)",
    "store upload (boto3 threads, 4 parts in flight)",
    f"store upload (boto3 threads, {WIDE} parts in flight)",
    f"obstore put ({WIDE} parts in flight)",
    "client upload_file to tmp/ + store read-back (sha256) + copy",
)
READ_CHECKED = f"{READ_BASE} + sha256 + fsync"
READ_ARMS = (
    READ_BASE,
    f"{READ_BASE} (again)",
    "replica presigned GET (HttpReader, aiohttp)",
    "obstore get",
    "presigned GET, aiohttp alone (no sha256, no fsync)",
    READ_CHECKED,
)


@dataclass(frozen=True)
class LibSettings:
    megabytes: int = 128
    repeats: int = 5


@dataclass
class Rig:
    """moto's bucket, reached by each library, and a scratch directory."""

    endpoint: str
    s3: Any
    location: S3Location
    work: Path

    def obstore(self) -> Any:
        from obstore.store import S3Store

        return S3Store(
            BUCKET,
            endpoint=self.endpoint,
            region=procs.REGION,
            access_key_id=procs.S3_KEY,
            secret_access_key=procs.S3_KEY,
            virtual_hosted_style_request=False,
            client_options={"allow_http": True},
        )


def _fresh(path: Path) -> FileInfo:
    """New bytes at the head of the file (no arm reads another's object); its info."""
    with path.open("r+b") as f:
        f.write(os.urandom(64))
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return FileInfo(path.name, path.stat().st_size, digest.hexdigest())


async def _store_upload(rig: Rig, source: Path, in_flight: int) -> float:
    info = await asyncio.to_thread(_fresh, source)
    store = S3BlobStore(rig.location, part_size=PART, parts_in_flight=in_flight)
    started = time.perf_counter()
    upload = await store.start_upload(info.sha256)
    with source.open("rb") as f:
        while block := await asyncio.to_thread(f.read, CHUNK):
            await upload.write(block)
    await upload.finish()
    await upload.keep()
    return time.perf_counter() - started


async def _obstore_put(rig: Rig, source: Path) -> float:
    import obstore

    await asyncio.to_thread(_fresh, source)
    digest = hashlib.sha256()

    def read_hashed(f: Any) -> bytes:
        block: bytes = f.read(CHUNK)
        digest.update(block)
        return block

    async def blocks() -> Any:
        with source.open("rb") as f:
            while block := await asyncio.to_thread(read_hashed, f):
                yield block

    started = time.perf_counter()
    await obstore.put_async(
        rig.obstore(), uuid.uuid4().hex, blocks(), chunk_size=PART, max_concurrency=WIDE
    )
    return time.perf_counter() - started


async def _upload_file(rig: Rig, source: Path) -> float:
    await asyncio.to_thread(_fresh, source)
    started = time.perf_counter()
    await asyncio.to_thread(rig.s3.upload_file, str(source), BUCKET, uuid.uuid4().hex)
    return time.perf_counter() - started


async def _http_read(url: str, info: FileInfo, work: Path) -> float:
    staging = Path(tempfile.mkdtemp(dir=work))
    reader = HttpReader(ReadSettings())
    try:
        started = time.perf_counter()
        await reader.read(url, info, staging)
        return time.perf_counter() - started
    finally:
        await reader.close()
        shutil.rmtree(staging, ignore_errors=True)


async def _aiohttp_get(url: str, work: Path) -> float:
    out = work / f"raw-{uuid.uuid4().hex}"
    try:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            started = time.perf_counter()
            async with session.get(URL(url, encoded=True)) as response:
                response.raise_for_status()
                with out.open("wb") as f:
                    async for block in response.content.iter_chunked(CHUNK):
                        f.write(block)
            return time.perf_counter() - started
    finally:
        out.unlink(missing_ok=True)


def _boto_checked(rig: Rig, key: str, info: FileInfo) -> float:
    """`get_object` streamed to a file with what a replica adds: SHA-256 as the bytes
    arrive, checked, and fsync before the file counts as there."""
    out = rig.work / f"checked-{uuid.uuid4().hex}"
    try:
        started = time.perf_counter()
        body = rig.s3.get_object(Bucket=BUCKET, Key=key)["Body"]
        digest = hashlib.sha256()
        with out.open("wb") as f:
            for block in body.iter_chunks(CHUNK):
                f.write(block)
                digest.update(block)
            f.flush()
            os.fsync(f.fileno())
        if digest.hexdigest() != info.sha256:
            raise RuntimeError("get_object's bytes do not match the file")
        return time.perf_counter() - started
    finally:
        out.unlink(missing_ok=True)


async def _obstore_get(rig: Rig, key: str, work: Path) -> float:
    import obstore

    out = work / f"get-{uuid.uuid4().hex}"
    digest = hashlib.sha256()

    def write_hashed(f: Any, block: bytes) -> None:
        f.write(block)
        digest.update(block)

    try:
        started = time.perf_counter()
        result = await obstore.get_async(rig.obstore(), key)
        with out.open("wb") as f:
            async for block in result.stream(min_chunk_size=CHUNK):
                await asyncio.to_thread(write_hashed, f, bytes(block))
            await asyncio.to_thread(os.fsync, f.fileno())
        return time.perf_counter() - started
    finally:
        out.unlink(missing_ok=True)


async def _uploaded_then_verified(rig: Rig, source: Path) -> float:
    """The other design (issue 24, item 2): the client uploads the parts itself (as fast
    as boto3's transfer manager at best) to a staging key, then the store reads every
    byte back to check it and copies it to its content address."""
    info = await asyncio.to_thread(_fresh, source)
    store = S3BlobStore(rig.location, part_size=PART)
    staged = f"tmp/{uuid.uuid4().hex}"
    started = time.perf_counter()
    await asyncio.to_thread(rig.s3.upload_file, str(source), BUCKET, staged)
    digest = hashlib.sha256()
    async for block in store.stream(staged, CHUNK):
        await asyncio.to_thread(digest.update, block)
    if digest.hexdigest() != info.sha256:
        raise RuntimeError("the read-back does not match the file")
    await store.copy(staged, f"blobs/{info.sha256}")
    return time.perf_counter() - started


def _write_arms(rig: Rig, source: Path) -> dict[str, Callable[[], Awaitable[float]]]:
    return {
        WRITE_ARMS[0]: lambda: _upload_file(rig, source),
        WRITE_ARMS[1]: lambda: _upload_file(rig, source),
        WRITE_ARMS[2]: lambda: _store_upload(rig, source, 4),
        WRITE_ARMS[3]: lambda: _store_upload(rig, source, WIDE),
        WRITE_ARMS[4]: lambda: _obstore_put(rig, source),
        WRITE_ARMS[5]: lambda: _uploaded_then_verified(rig, source),
    }


async def _read_arms(rig: Rig, source: Path) -> dict[str, Callable[[], Awaitable[float]]]:
    info = await asyncio.to_thread(_fresh, source)
    key = f"read/{info.name}"
    await asyncio.to_thread(rig.s3.upload_file, str(source), BUCKET, key)
    url = S3Presigner(rig.location).presign_get(key, 3600)
    return {
        READ_ARMS[0]: lambda: asyncio.to_thread(
            transfers.boto_stream, rig.s3, BUCKET, "read", [info.name]
        ),
        READ_ARMS[1]: lambda: asyncio.to_thread(
            transfers.boto_stream, rig.s3, BUCKET, "read", [info.name]
        ),
        READ_ARMS[2]: lambda: _http_read(url, info, rig.work),
        READ_ARMS[3]: lambda: _obstore_get(rig, key, rig.work),
        READ_ARMS[4]: lambda: _aiohttp_get(url, rig.work),
        READ_ARMS[5]: lambda: asyncio.to_thread(_boto_checked, rig, key, info),
    }


async def measure(rig: Rig, settings: LibSettings) -> dict[str, list[float]]:
    source = rig.work / "object"
    await asyncio.to_thread(source.write_bytes, os.urandom(settings.megabytes * CHUNK))
    arms = {**_write_arms(rig, source), **await _read_arms(rig, source)}
    seconds: dict[str, list[float]] = {arm: [] for arm in arms}
    for rep in range(settings.repeats):
        for group in (WRITE_ARMS, READ_ARMS):
            for arm in rotated(group, rep):
                seconds[arm].append(await arms[arm]())
    return seconds


def figures(section: Section, seconds: dict[str, list[float]], mb: float) -> None:
    rows: list[list[Cell]] = []
    for arm, values in seconds.items():
        section.record_values(arm, "seconds", values)
        rows.append([arm, median_interval(values).text(".2f"), mb / median(values)])
    section.table(
        f"One {mb:.0f} MB object (seconds: median [interval]; MB/s of the median)",
        ["arm", "seconds", "MB/s"],
        rows,
    )
    for group, base in ((WRITE_ARMS, WRITE_BASE), (READ_ARMS, READ_BASE)):
        for arm in group[2:]:
            section.reported(
                f"{arm} throughput / {base}",
                paired_ratio(seconds[base], seconds[arm]),
                ".2f",
            )
        if group is READ_ARMS:
            section.reported(
                f"{READ_ARMS[2]} throughput / {READ_CHECKED}",
                paired_ratio(seconds[READ_CHECKED], seconds[READ_ARMS[2]]),
                ".2f",
            )
        section.noise(
            f"{base} measured twice",
            paired_ratio(seconds[base], seconds[group[1]]),
            "transfer_seconds",
        )


async def run(report: Report, quick: bool = False) -> None:
    settings = LibSettings(megabytes=64, repeats=2) if quick else LibSettings()
    section = report.section(21, "S3 client libraries: boto3 + threads vs obstore")
    async with procs.moto_section(report, section, BUCKET, "bench-s3-libs-") as (endpoint, work):
        location = S3Location(BUCKET, "", endpoint, procs.REGION, procs.S3_KEY, procs.S3_KEY)
        rig = Rig(endpoint, procs.s3_client(endpoint), location, work)
        seconds = await measure(rig, settings)
        mb = settings.megabytes * CHUNK / 1e6
        section.workload.append(
            f"one object of {mb:.0f} MB, new bytes for every arm of every repeat, "
            f"{settings.repeats} repeats, arms rotated; moto's server in its own process; "
            f"parts of {PART >> 20} MiB"
        )
        figures(section, seconds, mb)
