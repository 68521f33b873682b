"""The three arms of a swap benchmark, both servers already up and serving adapter
`swap` at the same weights. Hot (a loaded adapter gets new weights): vLLM's `POST
/v1/load_lora_adapter` with `load_inplace` vs `adapterctl push` of a new revision.
Cold (an adapter neither server has): vLLM's load_lora_adapter under a new name vs
`adapterctl push` under a new name. The bare arm is what a user could hand-roll with the
same parts instead of a store: boto3 `upload_file` of the files to the same S3, boto3
`get_object` of them to disk, then vLLM's load_lora_adapter (in place on its own loaded
adapter `swap-bare`, or under a new name). Either way: swap start -> first token
produced by the new weights (bench.swap.probe), and loraserve's path in stages from its
logs and, with a receiver, from its trace (bench.swap.push_spans).

Every variant's seed is new to the process, so no benchmark pushes bytes an earlier one
stored (the store keeps blobs by digest and uploads nothing it holds: benchmark 17 once
re-pushed benchmark 16's variants and committed in a fifth of the time)."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.rig import procs
from bench.rig.variants import write_variant
from bench.store.transfers import adapter_files, boto_get, boto_upload
from bench.swap.probe import STAGES, load_lora, log_time, probe, probe_until, serving
from bench.swap.push_spans import SpanTimes, push_profile
from loraserve.testing.otlp import OtlpReceiver

SWAP = "swap"
# The bare arm's loaded adapter on vllm serve (hot): not `swap`, whose weights the vLLM
# arm has already replaced with the round's.
BARE_SWAP = "swap-bare"
REFERENCE = "swap-reference"
MAX_REDRAWS = 20
VLLM = "vLLM load_lora_adapter"
BARE = "bare S3 + vLLM load_lora_adapter"
LORASERVE = "loraserve adapterctl push"
ARMS = (VLLM, BARE, LORASERVE)
_SEEDS = itertools.count(1001)
# Streams of the base model each server serves while the swaps run (as the issue's
# publisher found a replica: serving 4 streams on another model), started this long
# before the first swap.
BACKGROUND_STREAMS = 4
WARM_UP_S = 3.0


@dataclass
class Swap:
    """One swap: seconds from its start to each milestone (NaN: not seen)."""

    arm: str
    first_token: float = float("nan")
    milestones: dict[str, float] = field(default_factory=dict)
    # loraserve's push span by span (bench.swap.push_spans); {} untraced.
    spans: dict[str, SpanTimes] = field(default_factory=dict)


@dataclass
class Servers:
    """What the arms talk to: both HTTP fronts, the store and its S3, the logs, the
    weights, and the receiver of loraserve's spans (None: untraced)."""

    vllm_url: str
    lora_url: str
    store: str
    s3_endpoint: str
    bucket: str
    logs: Path
    source: Path
    work: Path
    # The base model's name on each front: the background streams'.
    vllm_base: str
    lora_base: str
    otlp: OtlpReceiver | None = None


class SwapBench:
    def __init__(self, servers: Servers, *, cold: bool) -> None:
        self.servers = servers
        self.cold = cold
        self.revision = 1
        self.current: tuple[int, ...] = ()
        self.seed = 0
        self.s3: Any = procs.s3_client(servers.s3_endpoint)
        # (name, revision, wall time it started) of every push, profiled at the end.
        self.pushes: list[tuple[Swap, str, int, float]] = []

    async def start(self, session: aiohttp.ClientSession) -> None:
        """The current answer, and first-use costs outside the arms."""
        self.current, _, _ = await probe(session, self.servers.vllm_url, SWAP)
        await probe(session, self.servers.vllm_url, BARE_SWAP)
        await probe(session, self.servers.lora_url, SWAP)
        await asyncio.to_thread(self.s3.list_objects_v2, Bucket=self.servers.bucket, MaxKeys=1)

    async def next_variant(self, session: aiohttp.ClientSession) -> tuple[Path, tuple[int, ...]]:
        """New weights whose probe answer differs from the current ones', with that
        answer (learnt from vLLM under another name)."""
        for _ in range(MAX_REDRAWS):
            self.seed = next(_SEEDS)
            path = await asyncio.to_thread(
                write_variant, self.servers.source, self.servers.work / f"v{self.seed}", self.seed
            )
            await load_lora(session, self.servers.vllm_url, REFERENCE, path, inplace=True)
            ids, _, _ = await probe(session, self.servers.vllm_url, REFERENCE)
            if ids and ids != self.current:
                return path, ids
        raise RuntimeError(f"{MAX_REDRAWS} draws all answered {self.current!r}")

    async def vllm_swap(
        self, session: aiohttp.ClientSession, path: Path, expected: tuple[int, ...]
    ) -> Swap:
        swap = Swap(VLLM)
        name = f"cold-v{self.seed}" if self.cold else SWAP
        url = self.servers.vllm_url
        started = time.time()
        probing = asyncio.create_task(probe_until(session, url, name, expected, None))
        await load_lora(session, url, name, path, inplace=not self.cold)
        swap.milestones["load_lora_adapter answered"] = time.time() - started
        swap.first_token = await probing - started
        return swap

    async def bare_swap(
        self, session: aiohttp.ClientSession, path: Path, expected: tuple[int, ...]
    ) -> Swap:
        swap = Swap(BARE)
        name = f"cold-b{self.seed}" if self.cold else BARE_SWAP
        url, bucket = self.servers.vllm_url, self.servers.bucket
        prefix = f"bare/{self.seed}"
        target = self.servers.work / f"bare-{self.seed}"
        target.mkdir()
        started = time.time()
        probing = asyncio.create_task(probe_until(session, url, name, expected, None))
        await asyncio.to_thread(boto_upload, self.s3, bucket, path, prefix)
        swap.milestones["uploaded"] = time.time() - started
        await asyncio.to_thread(boto_get, self.s3, bucket, prefix, adapter_files(path), target)
        swap.milestones["downloaded"] = time.time() - started
        await load_lora(session, url, name, target, inplace=not self.cold)
        swap.milestones["load_lora_adapter answered"] = time.time() - started
        swap.first_token = await probing - started
        return swap

    async def lora_swap(
        self, session: aiohttp.ClientSession, path: Path, expected: tuple[int, ...]
    ) -> Swap:
        swap = Swap(LORASERVE)
        name = f"cold-l{self.seed}" if self.cold else SWAP
        revision = 1 if self.cold else self.revision + 1
        started = time.time()
        probing = asyncio.create_task(
            probe_until(session, self.servers.lora_url, name, expected, f"{name}@{revision}")
        )
        cli = await asyncio.create_subprocess_exec(
            *procs.ADAPTERCTL,
            "push",
            f"--store={self.servers.store}",
            name,
            str(path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await cli.communicate()
        swap.milestones["adapterctl exited"] = time.time() - started
        if cli.returncode != 0 or out.decode().strip() != f"{name}@{revision}":
            probing.cancel()
            raise RuntimeError(f"adapterctl push: exit {cli.returncode}: {out.decode()[-500:]}")
        if not self.cold:
            self.revision = revision
        swap.first_token = await probing - started
        for label, log, pattern in STAGES:
            at = log_time(self.servers.logs / f"{log}.log", pattern.format(name=name, rev=revision))
            swap.milestones[label] = at - started
        self.pushes.append((swap, name, revision, started))
        return swap

    async def profile_pushes(self) -> None:
        """Each push's spans, once the exporters delivered them (none: untraced)."""
        if self.servers.otlp is None:
            return
        for swap, name, revision, started in self.pushes:
            swap.spans = await push_profile(self.servers.otlp, name, revision, started)


async def cli_startup() -> float:
    """Seconds for `adapterctl --help`: interpreter, imports and parser, no I/O."""
    started = time.perf_counter()
    cli = await asyncio.create_subprocess_exec(
        *procs.ADAPTERCTL, "--help", stdout=asyncio.subprocess.DEVNULL
    )
    await cli.wait()
    return time.perf_counter() - started


async def rounds(
    servers: Servers, repeats: int, *, cold: bool, streams: int = BACKGROUND_STREAMS
) -> tuple[list[Swap], list[float]]:
    """`repeats` rounds of the three arms on the same new weights, their order rotating
    each round, while both servers stream `streams` requests of the base model; returns
    every swap and adapterctl's start-up time per round."""
    bench = SwapBench(servers, cold=cold)
    swaps: list[Swap] = []
    startup: list[float] = []
    background = [(servers.vllm_url, servers.vllm_base), (servers.lora_url, servers.lora_base)]
    async with aiohttp.ClientSession() as session, serving(session, background, streams):
        await bench.start(session)
        await asyncio.sleep(WARM_UP_S)
        for rep in range(repeats):
            path, expected = await bench.next_variant(session)
            arms = [bench.vllm_swap, bench.bare_swap, bench.lora_swap]
            for arm in arms[rep % 3 :] + arms[: rep % 3]:
                swaps.append(await arm(session, path, expected))
                await asyncio.sleep(0.5)
            bench.current = expected
            startup.append(await cli_startup())
        await bench.profile_pushes()
    return swaps, startup
