"""The two arms of a swap benchmark, both servers already up and serving adapter
`swap` at the same weights. Hot (a loaded adapter gets new weights): vLLM's `POST
/v1/load_lora_adapter` with `load_inplace` vs `adapterctl push` of a new revision.
Cold (an adapter neither server has): vLLM's load_lora_adapter under a new name vs
`adapterctl push` under a new name. Either way: swap start -> first token produced
by the new weights (bench.swap.probe), and loraserve's path in stages from its logs."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.rig import procs
from bench.rig.variants import write_variant
from bench.swap.probe import STAGES, load_lora, log_time, probe, probe_until

SWAP = "swap"
REFERENCE = "swap-reference"
MAX_REDRAWS = 20
ARMS = ("vLLM load_lora_adapter", "loraserve adapterctl push")


@dataclass
class Swap:
    """One swap: seconds from its start to each milestone (NaN: not seen)."""

    arm: str
    first_token: float = float("nan")
    milestones: dict[str, float] = field(default_factory=dict)


@dataclass
class Servers:
    """What the arms talk to: both HTTP fronts, the store, the logs, the weights."""

    vllm_url: str
    lora_url: str
    store: str
    logs: Path
    source: Path
    work: Path


class SwapBench:
    def __init__(self, servers: Servers, *, cold: bool) -> None:
        self.servers = servers
        self.cold = cold
        self.revision = 1
        self.current: tuple[int, ...] = ()
        self.seed = 1000

    async def start(self, session: aiohttp.ClientSession) -> None:
        """The current answer, and first-use costs outside the arms."""
        self.current, _, _ = await probe(session, self.servers.vllm_url, SWAP)
        await probe(session, self.servers.lora_url, SWAP)

    async def next_variant(self, session: aiohttp.ClientSession) -> tuple[Path, tuple[int, ...]]:
        """New weights whose probe answer differs from the current ones', with that
        answer (learnt from vLLM under another name)."""
        for _ in range(MAX_REDRAWS):
            self.seed += 1
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
        swap = Swap(ARMS[0])
        name = f"cold-v{self.seed}" if self.cold else SWAP
        url = self.servers.vllm_url
        started = time.time()
        probing = asyncio.create_task(probe_until(session, url, name, expected, None))
        await load_lora(session, url, name, path, inplace=not self.cold)
        swap.milestones["load_lora_adapter answered"] = time.time() - started
        swap.first_token = await probing - started
        return swap

    async def lora_swap(
        self, session: aiohttp.ClientSession, path: Path, expected: tuple[int, ...]
    ) -> Swap:
        swap = Swap(ARMS[1])
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
        return swap


async def cli_startup() -> float:
    """Seconds for `adapterctl --help`: interpreter, imports and parser, no I/O."""
    started = time.perf_counter()
    cli = await asyncio.create_subprocess_exec(
        *procs.ADAPTERCTL, "--help", stdout=asyncio.subprocess.DEVNULL
    )
    await cli.wait()
    return time.perf_counter() - started


async def rounds(servers: Servers, repeats: int, *, cold: bool) -> tuple[list[Swap], list[float]]:
    """`repeats` rounds of both arms on the same new weights, which arm goes first
    alternating; returns every swap and adapterctl's start-up time per round."""
    bench = SwapBench(servers, cold=cold)
    swaps: list[Swap] = []
    startup: list[float] = []
    async with aiohttp.ClientSession() as session:
        await bench.start(session)
        for rep in range(repeats):
            path, expected = await bench.next_variant(session)
            arms = [bench.vllm_swap, bench.lora_swap]
            for arm in arms if rep % 2 == 0 else arms[::-1]:
                swaps.append(await arm(session, path, expected))
                await asyncio.sleep(0.5)
            bench.current = expected
            startup.append(await cli_startup())
    return swaps, startup
