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
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.rig import procs
from bench.rig.variants import write_variant
from bench.store.transfers import adapter_files
from bench.swap.bare_s3 import BareS3
from bench.swap.probe import STAGES, load_lora, log_time, probe, probe_until, serving
from bench.swap.push_spans import ARRIVAL_S, SpanTimes, push_profile
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
ORDERS = list(itertools.permutations(range(len(ARMS))))
LOADED = "load_lora_adapter answered"
# The bare path's steps before its first token, in order.
BARE_STEPS = ("uploaded", "downloaded", LOADED)
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
        self.bare = BareS3(servers.s3_endpoint, servers.bucket)
        # (name, revision, wall time it started) of every push, profiled at the end.
        self.pushes: list[tuple[Swap, str, int, float]] = []

    async def start(self, session: aiohttp.ClientSession) -> None:
        """The current answer, and first-use costs outside the arms."""
        self.current, _, _ = await probe(session, self.servers.vllm_url, SWAP)
        await probe(session, self.servers.vllm_url, BARE_SWAP)
        await probe(session, self.servers.lora_url, SWAP)
        await asyncio.to_thread(self.bare.warm)

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
        name = f"cold-v{self.seed}" if self.cold else SWAP

        async def local(_: Callable[[str], None]) -> Path:
            return path

        return await self._loaded(session, Swap(VLLM), name, expected, local)

    async def bare_swap(
        self, session: aiohttp.ClientSession, path: Path, expected: tuple[int, ...]
    ) -> Swap:
        name = f"cold-b{self.seed}" if self.cold else BARE_SWAP
        prefix = f"bare/{self.seed}"
        target = self.servers.work / f"bare-{self.seed}"
        target.mkdir()
        names = adapter_files(path)

        async def through_s3(mark: Callable[[str], None]) -> Path:
            await asyncio.to_thread(self.bare.upload, path, prefix)
            mark(BARE_STEPS[0])
            await asyncio.to_thread(self.bare.get, prefix, names, target)
            mark(BARE_STEPS[1])
            return target

        return await self._loaded(session, Swap(BARE), name, expected, through_s3)

    async def _loaded(
        self,
        session: aiohttp.ClientSession,
        swap: Swap,
        name: str,
        expected: tuple[int, ...],
        fetch: Callable[[Callable[[str], None]], Awaitable[Path]],
    ) -> Swap:
        """One swap on vllm serve: `fetch` brings the files (marking its steps), then
        `load_lora_adapter` loads them as `name`; timed until the probe sees them."""
        url = self.servers.vllm_url
        started = time.time()

        def mark(step: str) -> None:
            swap.milestones[step] = time.time() - started

        async with probing(probe_until(session, url, name, expected, None)) as answered:
            files = await fetch(mark)
            await load_lora(session, url, name, files, inplace=not self.cold)
            mark(LOADED)
            swap.first_token = await answered - started
        return swap

    async def lora_swap(
        self, session: aiohttp.ClientSession, path: Path, expected: tuple[int, ...]
    ) -> Swap:
        swap = Swap(LORASERVE)
        name = f"cold-l{self.seed}" if self.cold else SWAP
        revision = 1 if self.cold else self.revision + 1
        served_as = f"{name}@{revision}"
        url = self.servers.lora_url
        started = time.time()
        async with probing(probe_until(session, url, name, expected, served_as)) as answered:
            out = await _push(self.servers.store, name, path)
            swap.milestones["adapterctl exited"] = time.time() - started
            if out != served_as:
                raise RuntimeError(f"adapterctl push answered {out[-500:]!r}")
            if not self.cold:
                self.revision = revision
            swap.first_token = await answered - started
        for label, log, pattern in STAGES:
            at = log_time(self.servers.logs / f"{log}.log", pattern.format(name=name, rev=revision))
            swap.milestones[label] = at - started
        self.pushes.append((swap, name, revision, started))
        return swap

    async def profile_pushes(self) -> None:
        """Each push's spans, once the exporters delivered them (none: untraced), all
        within ARRIVAL_S."""
        if self.servers.otlp is None:
            return
        deadline = asyncio.get_running_loop().time() + ARRIVAL_S
        for swap, name, revision, started in self.pushes:
            swap.spans = await push_profile(self.servers.otlp, name, revision, started, deadline)


@contextlib.asynccontextmanager
async def probing(probe: Coroutine[Any, Any, float]) -> AsyncIterator[asyncio.Task[float]]:
    """`probe` as a task for the block: one the block left before its answer is
    cancelled and waited for, never left probing into the next swap."""
    task = asyncio.create_task(probe)
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def _push(store: str, name: str, path: Path) -> str:
    """`adapterctl push`'s output (stdout and stderr); a push left early is killed."""
    cli = await asyncio.create_subprocess_exec(
        *procs.ADAPTERCTL,
        "push",
        f"--store={store}",
        name,
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await cli.communicate()
    except BaseException:
        cli.kill()
        await cli.wait()
        raise
    text = out.decode(errors="replace").strip()
    return text if cli.returncode == 0 else f"exit {cli.returncode}: {text}"


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
    """`repeats` rounds of the three arms on the same new weights, in each of their six
    orders in turn (each arm before each other in half of every six rounds), while both
    servers stream `streams` requests of the base model; returns every swap and
    adapterctl's start-up time per round."""
    bench = SwapBench(servers, cold=cold)
    swaps: list[Swap] = []
    startup: list[float] = []
    background = [(servers.vllm_url, servers.vllm_base), (servers.lora_url, servers.lora_base)]
    try:
        async with (
            aiohttp.ClientSession() as session,
            serving(session, background, streams) as alive,
        ):
            await bench.start(session)
            await asyncio.sleep(WARM_UP_S)
            arms = [bench.vllm_swap, bench.bare_swap, bench.lora_swap]
            for rep in range(repeats):
                alive()
                path, expected = await bench.next_variant(session)
                for index in ORDERS[rep % len(ORDERS)]:
                    swaps.append(await arms[index](session, path, expected))
                    await asyncio.sleep(0.5)
                bench.current = expected
                startup.append(await cli_startup())
            await bench.profile_pushes()
    finally:
        bench.bare.close()
    return swaps, startup
