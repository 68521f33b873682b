"""The streaming front's cost per token, steady state: a closed loop over each front.

    python -m bench.front.stream_probe [--arms grpc,grpclib,client,openai,vllm,sdk,grpc@8,...]
        [--clients 32] [--max-tokens 64] [--warmup 4] [--window 15] [--rounds 1]
        [--stream-interval N] [--profile DIR [--native-stacks]] [--loraserve NAME=PYTHONPATH ...]
        [--cpu-split] [--json OUT]
    python -m bench.front.stream_probe summarize PROFILE.txt     # a py-spy raw profile, by frame

One `inference serve` (gRPC and its OpenAI front, one engine; one per `--loraserve`
variant) and, for the `vllm` and `sdk` arms, `vllm serve` on the same model, 8 adapters
and engine flags. Each arm is a closed loop: `--clients` streams (ARM@N: N), each sending
its next request (greedy, ignore_eos, 16 prompt token ids, `--max-tokens` out, adapters
round robin) as soon as the last one ended. After `--warmup` seconds a window of
`--window` seconds is measured: tokens and messages that arrived in it, the CPU seconds
of the server's own process (its CPU clock, children excluded: vLLM's engine core is a child, so
this is the front alone), of its main thread (the event loop) and of this process (the
client), per 1,000 tokens; TTFT and inter-message gap p50 of requests inside it.

Arms: `grpc` the raw generated stub against `inference serve --grpc-transport grpcio` (one
message per token: the tokens/message column says so), `grpclib` the same stub against the
same server's Generate over grpclib with coalesced writes (bench/front/grpclib_front.py;
the server is started through it when this arm runs), `native` and `pushed` the same stub
against its Generate on the service's native transport (Rust's h2), pulled and pushed
(`pushed` is what `inference serve` serves on its address by default where the transport is
built), `client` loraserve.clients.InferenceClient.stream, `openai` loraserve's OpenAI
front with aiohttp (SSE), `vllm` `vllm serve` with the same aiohttp client, `sdk`
`openai.AsyncOpenAI` streaming from `vllm serve`. Arms alternate, their order rotating
every round. With --profile, one more round runs with py-spy recording each arm's server
(raw collapsed stacks, DIR/ARM.txt; with --native-stacks, C and
Rust frames too); its figures are printed, not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psutil

from bench.front import cpu_split, spy_summary
from bench.load.calls import grpc_caller, openai_caller
from bench.load.workload import Caller
from bench.method.cpu import cpu_seconds, thread_cpu_seconds
from bench.method.stats import median, percentile
from bench.rig import baselines, procs
from bench.rig.stack import ENGINE_ENV, RANK, Stack, tenant
from loraserve.clients.inference import InferenceClient, RetryPolicy
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.processes.services import free_port

ENGINE = procs.EngineConfig(max_loras=8, max_cpu_loras=8, max_lora_rank=RANK)
ADAPTERS = tuple(tenant(i) for i in range(8))
PROMPT = [3 + (7 * i) % 500 for i in range(16)]
ARMS = ("grpc", "grpclib", "native", "pushed", "client", "openai", "vllm", "sdk")
LORASERVE_ARMS = ("grpc", "grpclib", "native", "pushed", "client", "openai")
# How long the requests in flight at a window's end get to finish.
DRAIN_S = 60.0


@dataclass
class Window:
    """What one arm's measured window saw."""

    arm: str
    seconds: float = 0.0
    tokens: int = 0
    messages: int = 0
    server_cpu_s: float = 0.0
    # Of which the server's main thread: its event loop (grpc's poller, vLLM's and
    # asyncio's worker threads are the rest).
    loop_cpu_s: float = 0.0
    engine_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    errors: int = 0
    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    # The loop thread's CPU per message, split (bench.front.cpu_split), with --cpu-split.
    split: dict[str, float] = field(default_factory=dict)

    def figures(self) -> dict[str, float]:
        per_k = 1000.0 / max(self.tokens, 1)
        return {
            "tokens_per_s": self.tokens / self.seconds,
            "tokens_per_message": self.tokens / max(self.messages, 1),
            "server_cpu_ms_per_1k_tokens": self.server_cpu_s * per_k * 1000,
            "loop_cpu_ms_per_1k_tokens": self.loop_cpu_s * per_k * 1000,
            "engine_cpu_ms_per_1k_tokens": self.engine_cpu_s * per_k * 1000,
            "client_cpu_ms_per_1k_tokens": self.client_cpu_s * per_k * 1000,
            "ttft_p50_ms": percentile(self.ttft_s, 50) * 1000 if self.ttft_s else 0.0,
            "gap_p50_ms": percentile(self.gaps_s, 50) * 1000 if self.gaps_s else 0.0,
            "errors": self.errors,
            **self.split,
        }


def raw_grpc_caller(stub: Any, stream_interval: int) -> Caller:
    """The generated stub, nothing else: what a client in any language pays."""

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        if stream_interval:
            sampling.stream_interval = stream_interval
        request = pb.GenerateRequest(adapter=adapter, sampling=sampling)
        request.token_ids.ids.extend(prompt)
        async for response in stub.Generate(request):
            yield len(response.token_ids), 0

    return call


def sdk_caller(base_url: str) -> Caller:
    """openai.AsyncOpenAI streaming /v1/completions."""
    import openai

    sdk = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        events = await sdk.completions.create(
            model=adapter,
            prompt=list(prompt),
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        async for event in events:
            yield sum(len(getattr(c, "token_ids", None) or ()) for c in event.choices), 0

    return call


async def measure(
    arm: str,
    call: Caller,
    pid: int,
    clients: int,
    max_tokens: int,
    warmup: float,
    window: float,
    split: Path | None = None,
) -> Window:
    """Runs the closed loop; measures the window that starts `warmup` s in. After the window
    no client sends again and the requests in flight run to their end, so no arm's leftovers
    run into the next arm's window."""
    seen = Window(arm)
    bounds = [float("inf"), float("inf")]
    stopping = asyncio.Event()

    async def worker(k: int) -> None:
        n = k
        while not stopping.is_set():
            adapter = ADAPTERS[n % len(ADAPTERS)]
            n += clients
            sent = last = time.monotonic()
            first = True
            try:
                async for tokens, _ in call(adapter, PROMPT, max_tokens):
                    now = time.monotonic()
                    if bounds[0] <= now < bounds[1] and tokens:
                        seen.tokens += tokens
                        seen.messages += 1
                        (seen.ttft_s if first else seen.gaps_s).append(
                            now - (sent if first else last)
                        )
                    if tokens:
                        first, last = False, now
            except Exception:
                if bounds[0] <= time.monotonic() < bounds[1]:
                    seen.errors += 1

    workers = [asyncio.create_task(worker(k)) for k in range(clients)]
    try:
        await asyncio.sleep(warmup)
        server0, engine0 = process_cpu(pid)
        loop0 = thread_cpu_seconds(pid)
        split0 = cpu_split.latest(split) if split else {}
        client0, bounds[0] = time.process_time(), time.monotonic()
        bounds[1] = bounds[0] + window
        await asyncio.sleep(window)
        server1, engine1 = process_cpu(pid)
        loop1 = thread_cpu_seconds(pid)
        client1, end = time.process_time(), time.monotonic()
        seen.split = cpu_split.per_message(split0, cpu_split.latest(split) if split else {})
        stopping.set()
        await asyncio.wait(workers, timeout=DRAIN_S)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    seen.seconds = end - bounds[0]
    seen.server_cpu_s, seen.engine_cpu_s = server1 - server0, engine1 - engine0
    seen.loop_cpu_s = loop1 - loop0
    seen.client_cpu_s = client1 - client0
    return seen


def process_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the server's own process, and of its engine children."""
    children = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error, OSError):
            children += cpu_seconds(child.pid)
    return cpu_seconds(pid), children


@contextlib.asynccontextmanager
async def py_spy(
    pid: int, out: Path | None, seconds: float, native: bool = False
) -> AsyncIterator[None]:
    if out is None:
        yield
        return
    spy = await asyncio.create_subprocess_exec(
        *(str(procs.BIN / "py-spy"), "record", "--format", "raw", "-r", "250"),
        *(["--native"] if native else []),
        *("--duration", str(int(seconds)), "-o", str(out), "-p", str(pid)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            spy.send_signal(signal.SIGINT)
        await asyncio.wait_for(spy.wait(), 60)


@dataclass(frozen=True)
class Loraserve:
    """One `inference serve` under test: its name in the arms, process and HTTP front."""

    name: str
    child: procs.Child
    openai_url: str
    # bench/front/grpclib_front.py's second Generate, when the grpclib or native arm runs.
    grpclib_address: str = ""
    # Its third and fourth, on the native transport (pulled, pushed), when a native arm runs.
    native_address: str = ""
    pushed_address: str = ""


async def start_servers(
    stack: Stack,
    variants: dict[str, str],
    need_vllm: bool,
    grpclib: bool = False,
    native: bool = False,
    split_dir: Path | None = None,
) -> tuple[list[Loraserve], procs.Child | None]:
    """Each variant's `inference serve --grpc-transport grpcio` (gRPC + OpenAI front; its
    code from the variant's PYTHONPATH, "" for this checkout; with `grpclib` or `native`
    (both native ports), through bench/front/grpclib_front.py) and, if asked, `vllm serve`;
    all ready."""
    await stack.start_store()
    for name in ADAPTERS:
        await stack.push(name)
    servers, waits = [], []
    for name, pythonpath in variants.items():
        grpc_port, http_port = free_port(), free_port()
        argv = stack._argv(name, grpc_port, ENGINE, http_port)
        # The `grpc` arm is grpc.aio's; a variant older than --grpc-transport ignores this.
        env = {
            **ENGINE_ENV,
            "INFERENCE_GRPC_TRANSPORT": "grpcio",
            **({"PYTHONPATH": pythonpath} if pythonpath else {}),
            **({cpu_split.ENV: str(split_dir)} if split_dir else {}),
        }
        grpclib_port = free_port() if grpclib or native else 0
        native_port = free_port() if native else 0
        pushed_port = free_port() if native else 0
        command = (
            [
                sys.executable,
                "-m",
                "bench.front.grpclib_front",
                f"--grpclib-port={grpclib_port}",
                f"--native-port={native_port}",
                f"--pushed-port={pushed_port}",
            ]
            if grpclib_port
            else []
        )
        child = procs.start_inference(
            stack.logs, name, argv, f"127.0.0.1:{grpc_port}", env, command
        )
        stack.children.append(child)
        grpclib_address = f"127.0.0.1:{grpclib_port}" if grpclib else ""
        native_address = f"127.0.0.1:{native_port}" if native else ""
        pushed_address = f"127.0.0.1:{pushed_port}" if native else ""
        openai_url = f"http://127.0.0.1:{http_port}"
        servers.append(
            Loraserve(name, child, openai_url, grpclib_address, native_address, pushed_address)
        )
        waits.append(procs.wait_serving(child, stack.logs, 600))
    vllm = None
    if need_vllm:
        adapters = {name: stack.adapters[name] for name in ADAPTERS}
        serve_argv = stack.argv("vllm-serve", free_port(), ENGINE)
        vllm = baselines.start_serve(stack.logs, serve_argv, adapters, ENGINE_ENV)
        stack.children.append(vllm)
        waits.append(baselines.http_ready(vllm, stack.logs, 600))
    await asyncio.gather(*waits)
    return servers, vllm


Arms = dict[str, tuple[Caller, int]]


async def open_arms(
    exits: contextlib.AsyncExitStack,
    servers: Sequence[Loraserve],
    vllm: procs.Child | None,
    stream_interval: int,
) -> Arms:
    """Every arm's caller and the pid of the server it measures; loraserve's arms are
    named ARM:VARIANT when more than one variant runs."""
    http = await exits.enter_async_context(
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
    )
    arms: Arms = {}
    for server in servers:
        suffix = f":{server.name}" if len(servers) > 1 else ""
        pid = server.child.process.pid
        channel = await exits.enter_async_context(grpc.aio.insecure_channel(server.child.address))
        client = await exits.enter_async_context(
            InferenceClient(server.child.address, retry=RetryPolicy(max_attempts=1))
        )
        stub = pb_grpc.InferenceServiceStub(channel)
        arms["grpc" + suffix] = (raw_grpc_caller(stub, stream_interval), pid)
        if server.grpclib_address:
            grpclib = await exits.enter_async_context(
                grpc.aio.insecure_channel(server.grpclib_address)
            )
            stub = pb_grpc.InferenceServiceStub(grpclib)
            arms["grpclib" + suffix] = (raw_grpc_caller(stub, stream_interval), pid)
        for kind, address in (("native", server.native_address), ("pushed", server.pushed_address)):
            if address:
                native = await exits.enter_async_context(grpc.aio.insecure_channel(address))
                stub = pb_grpc.InferenceServiceStub(native)
                arms[kind + suffix] = (raw_grpc_caller(stub, stream_interval), pid)
        arms["client" + suffix] = (grpc_caller(client), pid)
        arms["openai" + suffix] = (openai_caller(http, server.openai_url, ""), pid)
    if vllm is not None:
        arms["vllm"] = (openai_caller(http, vllm.address, ""), vllm.process.pid)
        arms["sdk"] = (sdk_caller(vllm.address), vllm.process.pid)
    return arms


async def run_rounds(
    args: argparse.Namespace, arms: Arms, chosen: list[str]
) -> dict[str, list[dict[str, float]]]:
    """The rounds, arms rotating; with --profile, one more round under py-spy, kept out
    of the figures."""
    windows: dict[str, list[dict[str, float]]] = {arm: [] for arm in chosen}
    profiled = [args.profile] if args.profile else []
    split_dir = _split_dir(args)
    for rnd, profile in enumerate([""] * args.rounds + profiled):
        for arm in chosen[rnd % len(chosen) :] + chosen[: rnd % len(chosen)]:
            name, _, clients = arm.partition("@")
            call, pid = arms[name]
            out = Path(profile) / f"{arm}.txt" if profile else None
            if out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
            async with py_spy(pid, out, args.window + args.warmup, args.native_stacks):
                seen = await measure(
                    arm,
                    call,
                    pid,
                    int(clients),
                    args.max_tokens,
                    args.warmup,
                    args.window,
                    split_dir / f"{pid}.jsonl" if split_dir else None,
                )
            figures = seen.figures()
            if not profile:
                windows[arm].append(figures)
            label = "profiled" if profile else f"round {rnd + 1}"
            print(f"{label} {arm}: " + _line(figures), flush=True)
    return windows


def _split_dir(args: argparse.Namespace) -> Path | None:
    """Where the servers write their CPU split (bench.front.cpu_split), with --cpu-split."""
    if not args.cpu_split:
        return None
    directory = Path(args.results) / "cpu-split"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


async def run(args: argparse.Namespace) -> dict[str, Any]:
    variants = dict(v.partition("=")[::2] for v in args.loraserve) or {"loraserve": ""}
    # ARM or ARM@CLIENTS; loraserve's arms once per variant (ARM:VARIANT@CLIENTS).
    specs = [a.partition("@") for a in args.arms.split(",") if a]
    kinds = {kind for kind, _, _ in specs}
    if unknown := kinds - set(ARMS):
        raise SystemExit(f"unknown arms {sorted(unknown)}; known: {', '.join(ARMS)}")
    suffixes = [f":{name}" for name in variants] if len(variants) > 1 else [""]
    chosen = [
        f"{kind}{suffix}@{clients or args.clients}"
        for kind, _, clients in specs
        for suffix in (suffixes if kind in LORASERVE_ARMS else [""])
    ]
    stack = Stack(Path(args.results), Path(tempfile.mkdtemp(prefix="stream-probe-")))
    try:
        stack.build_models()
        servers, vllm = await start_servers(
            stack,
            variants,
            bool({"vllm", "sdk"} & kinds),
            "grpclib" in kinds,
            bool({"native", "pushed"} & kinds),
            _split_dir(args),
        )
        async with contextlib.AsyncExitStack() as exits:
            arms = await open_arms(exits, servers, vllm, args.stream_interval)
            windows = await run_rounds(args, arms, chosen)
    finally:
        await stack.close()
    summary = {
        "workload": f"ARM@CLIENTS, {args.max_tokens} tokens/request, greedy, "
        f"{len(ADAPTERS)} adapters, warm-up {args.warmup} s, window {args.window} s",
        "variants": variants,
        "stream_interval": args.stream_interval,
        "windows": windows,
        "medians": {
            # A window without messages has no split: each figure over the windows that have it.
            arm: {k: median([w[k] for w in ws if k in w]) for k in set().union(*ws)}
            for arm, ws in windows.items()
            if ws
        },
    }
    print(json.dumps(summary["medians"], indent=1), flush=True)
    return summary


def _line(figures: dict[str, float]) -> str:
    return (
        f"{figures['tokens_per_s']:.0f} tok/s, {figures['tokens_per_message']:.2f} tok/msg, "
        f"CPU ms/1k tok: server {figures['server_cpu_ms_per_1k_tokens']:.1f} "
        f"(loop {figures['loop_cpu_ms_per_1k_tokens']:.1f}) "
        f"engine {figures['engine_cpu_ms_per_1k_tokens']:.1f} "
        f"client {figures['client_cpu_ms_per_1k_tokens']:.1f}; "
        f"TTFT p50 {figures['ttft_p50_ms']:.1f} ms, gap p50 {figures['gap_p50_ms']:.1f} ms, "
        f"errors {figures['errors']:.0f}" + _split_line(figures)
    )


def _split_line(figures: dict[str, float]) -> str:
    if "thread_us" not in figures:
        return ""
    return (
        f"; loop µs/msg {figures['thread_us']:.1f} = vLLM outputs "
        f"{figures['vllm_outputs_us']:.1f} + sink {figures['sink_us']:.1f} + flush "
        f"{figures['flush_us']:.1f} + rest {figures['rest_us']:.1f} "
        f"({figures['messages_per_step']:.1f} msg/step)"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.front.stream_probe", description=__doc__)
    parser.add_argument("--arms", default="grpc,openai,vllm", help=f"from {','.join(ARMS)}")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--stream-interval", type=int, default=0, help="grpc arm's, 0: unset")
    parser.add_argument("--profile", default="", help="py-spy raw profiles here, one per arm")
    parser.add_argument(
        "--native-stacks", action="store_true", help="profiles with C and Rust frames"
    )
    parser.add_argument(
        "--loraserve",
        action="append",
        default=[],
        metavar="NAME=PYTHONPATH",
        help="a loraserve server to measure, its code from PYTHONPATH (empty: this checkout); "
        "repeat for several, side by side (before/after); default one, this checkout",
    )
    parser.add_argument("--json", default="", help="write the windows and medians here")
    parser.add_argument(
        "--cpu-split",
        action="store_true",
        help="the pushed arm's loop-thread CPU per message, split (bench.front.cpu_split)",
    )
    parser.add_argument(
        "--results", default=os.path.join(tempfile.gettempdir(), "stream-probe"), help="logs here"
    )
    return parser


if __name__ == "__main__":
    if sys.argv[1:2] == ["summarize"]:
        print(spy_summary.summarize(Path(sys.argv[2])))
    else:
        options = _parser().parse_args()
        found = asyncio.run(run(options))
        if options.json:
            Path(options.json).write_text(json.dumps(found, indent=1))
