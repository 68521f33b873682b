"""Benchmark 9: hot swap, loraserve's whole path vs vLLM's own in-place reload.

vLLM arm: `vllm serve` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; `POST
/v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true}` with new weights
-> first token produced from them. loraserve arm: the `adapterctl push` process (start-up,
hashing, upload) -> store -> S3 -> watch event -> download -> engine load -> route ->
first token from the new revision. Every push has weights never seen before (no
deduplication). Both arms use the same probe: one-token greedy /v1/completions
requests for the adapter, back to back, until one answers with the new weights'
token (loraserve: also from the new revision); a push that no probe saw within
PROBE_TIMEOUT_S is counted, not dropped. The new weights' token is learnt beforehand
from vLLM under another name, and a draw whose token equals the old one is redrawn.

loraserve's path is split into stages from the servers' own log lines (store
`adapter.pushed`; inference `sync.event`, `cache.downloaded`, `adapter.loaded`,
`adapter.routed`), the CLI's exit, and the probe's first token.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import baselines, procs, storeops
from bench.report import Report, Section
from bench.stack import ENGINE_A, ENGINE_ENV, Stack
from bench.stats import median, percentile
from bench.variants import write_variant
from loraserve.testing.processes import free_port

SWAP = "swap"
REFERENCE = "swap-reference"
PROMPT = [5, 17, 42, 99]
PROBE_TIMEOUT_S = 30.0
MAX_REDRAWS = 20
ARMS = ("vllm load_inplace", "loraserve adapterctl push")
# loraserve's stages, in path order: (label, log file, event pattern for `swap` rev N).
_STAGES = (
    ("store committed", "adapterstore", r"adapter\.pushed name=swap rev={rev} "),
    ("event received", "loraserve", r"sync\.event .*name=swap rev={rev} "),
    ("downloaded", "loraserve", r"cache\.downloaded name=swap rev={rev} "),
    ("engine loaded", "loraserve", r"adapter\.loaded name=swap rev={rev} lora_int_id"),
    ("routed", "loraserve", r"adapter\.routed name=swap rev={rev} "),
)
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass
class Swap:
    """One swap: seconds from its start to each milestone (NaN: not seen)."""

    arm: str
    first_token: float = float("nan")
    milestones: dict[str, float] = field(default_factory=dict)


async def _probe(session: aiohttp.ClientSession, url: str, model: str) -> tuple[str, str, float]:
    """One streamed one-token request: (text, model that answered, first-token time)."""
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": True,
    }
    text, served, first = "", "", float("nan")
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"probe: HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            event = _loads(line[6:])
            served = served or str(event.get("model", ""))
            for choice in event.get("choices", ()):
                if choice.get("text") and not text:
                    text, first = choice["text"], time.time()
    return text, served, first


def _loads(data: bytes) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(data)
    return value


async def _probe_until(
    session: aiohttp.ClientSession, url: str, expected: str, served_as: str | None
) -> float:
    """Probes back to back until the answer is `expected` (and, when given, came from
    the model `served_as`); returns the wall time of that answer's first token."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    while time.monotonic() < deadline:
        text, served, first = await _probe(session, url, SWAP)
        if text == expected and (served_as is None or served == served_as):
            return first
    return float("nan")


async def _load(session: aiohttp.ClientSession, url: str, name: str, path: Path) -> None:
    body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
    async with session.post(f"{url}/v1/load_lora_adapter", json=body) as response:
        if response.status != 200:
            raise RuntimeError(
                f"load_lora_adapter: HTTP {response.status}: {await response.text()}"
            )


def _log_times(log: Path, pattern: str) -> float:
    """Wall time of the first log line matching `pattern` (NaN: none)."""
    wanted = re.compile(pattern)
    for line in log.read_text(errors="replace").splitlines():
        if wanted.search(line) and (stamp := _STAMP.match(line)):
            parsed = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f")
            return parsed.timestamp()
    return float("nan")


class SwapBench:
    """Both servers up, each serving `swap` at the same weights."""

    def __init__(self, stack: Stack, vllm_url: str, lora_url: str, work: Path) -> None:
        self.stack = stack
        self.vllm_url = vllm_url
        self.lora_url = lora_url
        self.work = work
        self.revision = 0
        self.current_text = ""
        self.seed = 1000

    async def next_variant(self, session: aiohttp.ClientSession) -> tuple[Path, str]:
        """New weights whose probe answer differs from the current ones', with that answer."""
        for _ in range(MAX_REDRAWS):
            self.seed += 1
            path = await asyncio.to_thread(
                write_variant,
                self.stack.adapters["swap-v0"],
                self.work / f"v{self.seed}",
                self.seed,
            )
            await _load(session, self.vllm_url, REFERENCE, path)
            text, _, _ = await _probe(session, self.vllm_url, REFERENCE)
            if text and text != self.current_text:
                return path, text
        raise RuntimeError(f"{MAX_REDRAWS} draws all answered {self.current_text!r}")

    async def vllm_swap(self, session: aiohttp.ClientSession, path: Path, expected: str) -> Swap:
        swap = Swap(ARMS[0])
        started = time.time()
        probing = asyncio.create_task(_probe_until(session, self.vllm_url, expected, None))
        await _load(session, self.vllm_url, SWAP, path)
        swap.milestones["load_lora_adapter answered"] = time.time() - started
        swap.first_token = await probing - started
        return swap

    async def lora_swap(self, session: aiohttp.ClientSession, path: Path, expected: str) -> Swap:
        swap = Swap(ARMS[1])
        revision = self.revision + 1
        assert self.stack.store is not None
        started = time.time()
        probing = asyncio.create_task(
            _probe_until(session, self.lora_url, expected, f"{SWAP}@{revision}")
        )
        cli = await asyncio.create_subprocess_exec(
            *procs.ADAPTERCTL,
            "push",
            f"--store={self.stack.store.address}",
            SWAP,
            str(path),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await cli.communicate()
        swap.milestones["adapterctl exited"] = time.time() - started
        if cli.returncode != 0 or out.decode().strip() != f"{SWAP}@{revision}":
            probing.cancel()
            raise RuntimeError(f"adapterctl push: exit {cli.returncode}: {out.decode()[-500:]}")
        self.revision = revision
        swap.first_token = await probing - started
        for label, log, pattern in _STAGES:
            at = _log_times(self.stack.logs / f"{log}.log", pattern.format(rev=revision))
            swap.milestones[label] = at - started
        return swap


def _median_seen(values: list[float]) -> float:
    """Median of the values that were seen (not NaN)."""
    return median([v for v in values if not math.isnan(v)])


async def _cli_startup() -> float:
    """Seconds for `adapterctl --help`: interpreter, imports and parser, no I/O."""
    started = time.perf_counter()
    cli = await asyncio.create_subprocess_exec(
        *procs.ADAPTERCTL, "--help", stdout=asyncio.subprocess.DEVNULL
    )
    await cli.wait()
    return time.perf_counter() - started


async def _start(stack: Stack) -> tuple[procs.Child, str, procs.Child]:
    """loraserve (INFO logs, OpenAI front) and `vllm serve` (runtime LoRA updates)."""
    await stack.start_store(log_level="INFO")
    await stack.push(SWAP, "swap-v0")
    grpc_port, http_port = free_port(), free_port()
    engine_argv = stack._argv("loraserve", grpc_port, ENGINE_A)
    argv = [*engine_argv, f"--openai-listen=127.0.0.1:{http_port}", "--log-level=INFO"]
    lora = procs.start_inference(
        stack.logs, "loraserve", argv, f"127.0.0.1:{grpc_port}", ENGINE_ENV
    )
    stack.children.append(lora)
    vllm = baselines.start_serve(
        stack.logs,
        engine_argv,
        {SWAP: stack.adapters["swap-v0"]},
        {**ENGINE_ENV, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
    )
    stack.children.append(vllm)
    lora_url = f"http://127.0.0.1:{http_port}"
    await asyncio.gather(
        baselines.http_ready(lora, stack.logs, 600, lora_url),
        baselines.http_ready(vllm, stack.logs, 600),
    )
    return lora, lora_url, vllm


async def _hashing(directory: Path) -> float:
    """Seconds adapterctl's hashing of `directory` takes, in this process."""
    started = time.perf_counter()
    await storeops.hashed(directory)
    return time.perf_counter() - started


async def measure(results_dir: Path, repeats: int) -> tuple[list[Swap], list[float], list[float]]:
    """Runs `repeats` swaps of each arm, alternating which goes first."""
    work = Path(tempfile.mkdtemp(prefix="bench-swap-vllm-"))
    stack = Stack(results_dir, work)
    try:
        stack.build_models()
        _, lora_url, vllm = await _start(stack)
        bench = SwapBench(stack, vllm.address, lora_url, work)
        bench.revision = 1
        swaps: list[Swap] = []
        startup: list[float] = []
        hashing: list[float] = []
        async with aiohttp.ClientSession() as session:
            bench.current_text, _, _ = await _probe(session, vllm.address, SWAP)
            for url in (vllm.address, lora_url):  # first-use costs outside the arms
                await _probe(session, url, SWAP)
            for rep in range(repeats):
                path, expected = await bench.next_variant(session)
                arms = [bench.vllm_swap, bench.lora_swap]
                for arm in arms if rep % 2 == 0 else arms[::-1]:
                    swaps.append(await arm(session, path, expected))
                    await asyncio.sleep(0.5)
                bench.current_text = expected
                startup.append(await _cli_startup())
                hashing.append(await _hashing(path))
        return swaps, startup, hashing
    finally:
        await stack.close()


async def run(report: Report, *, quick: bool) -> None:
    section = report.section(9, "Hot swap: adapterctl push vs vLLM load_inplace")
    started = time.monotonic()
    repeats = 3 if quick else 10
    try:
        swaps, startup, hashing = await measure(report.results_dir, repeats)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        report.print_section(section)
        raise
    section.workload += [
        f"{repeats} swaps per arm, arms alternated; engine settings of engine A on both "
        f"(max_loras {ENGINE_A.max_loras}, max_cpu_loras {ENGINE_A.max_cpu_loras}, rank "
        f"{ENGINE_A.max_lora_rank}, fp32, eager; vllm serve's flags derived from "
        "loraserve's settings, bench/vllm_args.py); idle servers",
        "every swap new weights (rank 8, all 7 projections, never pushed before)",
        "probe: one-token greedy streamed /v1/completions for the adapter, back to back; "
        "swap latency = swap start -> first token of the first probe answered by the new "
        f"weights; not seen within {PROBE_TIMEOUT_S:.0f} s = missed",
    ]
    vllm_p50 = _arm_table(section, swaps)
    lora_p50 = _stage_table(section, [s for s in swaps if s.arm == ARMS[1]], startup, hashing)
    _record(section, swaps, startup, hashing)
    section.goal("loraserve swap p50 (s)", lora_p50, "< 0.2", lora_p50 < 0.2, ".3f")
    section.goal("vLLM load_inplace swap p50 (s)", vllm_p50, "reported", None, ".3f")
    section.notes.append(
        "The vLLM arm reloads weights already on the server's disk; the loraserve arm "
        "publishes them from the user's directory through the store and S3 to every "
        "replica, which keep serving the old revision until the new one is loaded."
    )
    section.seconds = time.monotonic() - started
    report.print_section(section)


def _arm_table(section: Section, swaps: list[Swap]) -> float:
    """Swap latency by arm; returns the vLLM arm's median (s)."""
    rows: list[list[str | int | float]] = []
    for arm in ARMS:
        mine = [s for s in swaps if s.arm == arm]
        seen = [s.first_token for s in mine if not math.isnan(s.first_token)]
        rows.append(
            [
                arm,
                len(mine),
                len(mine) - len(seen),
                median(seen) * 1000,
                percentile(seen, 95) * 1000,
                max(seen, default=float("nan")) * 1000,
            ]
        )
    section.table(
        "Swap start -> first token from the new weights (ms)",
        ["arm", "swaps", "missed", "p50", "p95", "max"],
        rows,
    )
    vllm_p50 = rows[0][3]
    assert isinstance(vllm_p50, float)
    return vllm_p50 / 1000


def _stage_table(
    section: Section, lora: list[Swap], startup: list[float], hashing: list[float]
) -> float:
    """loraserve's milestones in the order they came; returns its first token's median (s)."""
    labels = [label for label, _, _ in _STAGES] + ["adapterctl exited"]
    milestones = sorted(
        ((_median_seen([s.milestones[m] for s in lora]), m) for m in labels),
        key=lambda pair: pair[0],
    )
    stage_rows: list[list[str | int | float]] = [
        ["adapterctl start-up (`--help`, measured apart)", median(startup) * 1000, ""],
        ["adapterctl hashing (measured apart)", median(hashing) * 1000, ""],
    ]
    previous = 0.0
    for at, label in milestones:
        stage_rows.append([label, at * 1000, (at - previous) * 1000])
        previous = at
    first = _median_seen([s.first_token for s in lora])
    stage_rows.append(
        ["first token from the new revision", first * 1000, (first - previous) * 1000]
    )
    section.table(
        "loraserve's path: median time of each milestone after the push started (ms)",
        ["milestone", "at", "since the previous"],
        stage_rows,
    )
    return first


def _record(
    section: Section, swaps: list[Swap], startup: list[float], hashing: list[float]
) -> None:
    """Every swap of both arms in results.json, with its milestones (seconds after its
    start; NaN: not seen)."""
    for arm in ARMS:
        section.record(
            arm,
            [{"first_token_s": s.first_token, **s.milestones} for s in swaps if s.arm == arm],
        )
    section.record_values("adapterctl start-up (--help)", "seconds", startup)
    section.record_values("adapterctl hashing", "seconds", hashing)
