"""The streaming front's cost per token, steady state: a closed loop over each front.

    python -m bench.stream_probe [--arms grpc,client,openai,vllm,sdk] [--clients 32]
        [--max-tokens 64] [--warmup 4] [--window 15] [--rounds 1] [--stream-interval N]
        [--profile DIR] [--loraserve-pythonpath PATH] [--json OUT]
    python -m bench.stream_probe summarize PROFILE.txt     # a py-spy raw profile, by frame

One `inference serve` (gRPC and its OpenAI front, one engine) and, for the `vllm` and `sdk`
arms, `vllm serve` on the same model, 8 adapters and engine flags. Each arm is a closed
loop: `--clients` streams, each sending its next request (greedy, ignore_eos, 16 prompt
token ids, `--max-tokens` out, adapters round robin) as soon as the last one ended. After
`--warmup` seconds a window of `--window` seconds is measured: tokens and messages that
arrived in it, the CPU seconds of the server's own process (psutil, children excluded:
vLLM's engine core is a child, so this is the front alone) and of this process (the
client), per 1,000 tokens; TTFT and inter-message gap p50 of requests inside it.

Arms: `grpc` the raw generated stub (one message per token: the tokens/message column
says so), `client` loraserve.clients.InferenceClient.stream, `openai` loraserve's OpenAI
front with aiohttp (SSE), `vllm` `vllm serve` with the same aiohttp client, `sdk`
`openai.AsyncOpenAI` streaming from `vllm serve`. Arms alternate, their order rotating
every round. With --profile, one more round runs with py-spy recording each arm's server
(raw collapsed stacks, DIR/ARM.txt); its figures are printed, not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from bench import baselines, procs
from bench.calls import grpc_caller, openai_caller
from bench.openai_front import _cpu as process_cpu
from bench.stack import ENGINE_ENV, RANK, Stack, tenant
from bench.stats import median, percentile
from bench.workload import Caller
from loraserve.clients.inference import InferenceClient, RetryPolicy
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.processes import free_port

ENGINE = procs.EngineConfig(max_loras=8, max_cpu_loras=8, max_lora_rank=RANK)
ADAPTERS = tuple(tenant(i) for i in range(8))
PROMPT = [3 + (7 * i) % 500 for i in range(16)]
ARMS = ("grpc", "client", "openai", "vllm", "sdk")


@dataclass
class Window:
    """What one arm's measured window saw."""

    arm: str
    seconds: float = 0.0
    tokens: int = 0
    messages: int = 0
    server_cpu_s: float = 0.0
    engine_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    errors: int = 0
    ttft_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)

    def figures(self) -> dict[str, float]:
        per_k = 1000.0 / max(self.tokens, 1)
        return {
            "tokens_per_s": self.tokens / self.seconds,
            "tokens_per_message": self.tokens / max(self.messages, 1),
            "server_cpu_ms_per_1k_tokens": self.server_cpu_s * per_k * 1000,
            "engine_cpu_ms_per_1k_tokens": self.engine_cpu_s * per_k * 1000,
            "client_cpu_ms_per_1k_tokens": self.client_cpu_s * per_k * 1000,
            "ttft_p50_ms": percentile(self.ttft_s, 0.5) * 1000 if self.ttft_s else 0.0,
            "gap_p50_ms": percentile(self.gaps_s, 0.5) * 1000 if self.gaps_s else 0.0,
            "errors": self.errors,
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
    arm: str, call: Caller, pid: int, clients: int, max_tokens: int, warmup: float, window: float
) -> Window:
    """Runs the closed loop; measures the window that starts `warmup` s in."""
    seen = Window(arm)
    bounds = [float("inf"), float("inf")]

    async def worker(k: int) -> None:
        n = k
        while True:
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
        client0, bounds[0] = time.process_time(), time.monotonic()
        bounds[1] = bounds[0] + window
        await asyncio.sleep(window)
        server1, engine1 = process_cpu(pid)
        client1, end = time.process_time(), time.monotonic()
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    seen.seconds = end - bounds[0]
    seen.server_cpu_s, seen.engine_cpu_s = server1 - server0, engine1 - engine0
    seen.client_cpu_s = client1 - client0
    return seen


@contextlib.asynccontextmanager
async def py_spy(pid: int, out: Path | None, seconds: float) -> AsyncIterator[None]:
    if out is None:
        yield
        return
    spy = await asyncio.create_subprocess_exec(
        *(str(procs.BIN / "py-spy"), "record", "--format", "raw", "-r", "250"),
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


async def start_servers(stack: Stack, arms: Sequence[str], pythonpath: str) -> dict[str, Any]:
    """`inference serve` (gRPC + OpenAI front) and, if an arm needs it, `vllm serve`."""
    await stack.start_store()
    for name in ADAPTERS:
        await stack.push(name)
    grpc_port, http_port = free_port(), free_port()
    argv = stack._argv("loraserve", grpc_port, ENGINE, http_port)
    env = {**ENGINE_ENV, **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    lora = procs.start_inference(stack.logs, "loraserve", argv, f"127.0.0.1:{grpc_port}", env)
    stack.children.append(lora)
    found: dict[str, Any] = {"loraserve": lora, "openai_url": f"http://127.0.0.1:{http_port}"}
    waits = [procs.wait_serving(lora, stack.logs, 600)]
    if {"vllm", "sdk"} & set(arms):
        adapters = {name: stack.adapters[name] for name in ADAPTERS}
        serve_argv = stack.argv("vllm-serve", free_port(), ENGINE)
        vllm = baselines.start_serve(stack.logs, serve_argv, adapters, ENGINE_ENV)
        stack.children.append(vllm)
        found["vllm"] = vllm
        waits.append(baselines.http_ready(vllm, stack.logs, 600))
    await asyncio.gather(*waits)
    return found


async def run(args: argparse.Namespace) -> dict[str, Any]:
    arms = [a for a in args.arms.split(",") if a]
    if unknown := set(arms) - set(ARMS):
        raise SystemExit(f"unknown arms {sorted(unknown)}; known: {', '.join(ARMS)}")
    stack = Stack(Path(args.results), Path(tempfile.mkdtemp(prefix="stream-probe-")))
    windows: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    try:
        stack.build_models()
        servers = await start_servers(stack, arms, args.loraserve_pythonpath)
        lora_pid = servers["loraserve"].process.pid
        channel = grpc.aio.insecure_channel(servers["loraserve"].address)
        client = InferenceClient(servers["loraserve"].address, retry=RetryPolicy(max_attempts=1))
        http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        vllm = servers.get("vllm")
        stub = pb_grpc.InferenceServiceStub(channel)
        makers: dict[str, tuple[Callable[[], Caller], int]] = {
            "grpc": (lambda: raw_grpc_caller(stub, args.stream_interval), lora_pid),
            "client": (lambda: grpc_caller(client), lora_pid),
            "openai": (lambda: openai_caller(http, servers["openai_url"], ""), lora_pid),
        }
        if vllm is not None:
            makers["vllm"] = (lambda: openai_caller(http, vllm.address, ""), vllm.process.pid)
            makers["sdk"] = (lambda: sdk_caller(vllm.address), vllm.process.pid)
        # With --profile, one more round under py-spy, kept out of the figures.
        profiled = [args.profile] if args.profile else []
        try:
            for rnd, profile in enumerate([""] * args.rounds + profiled):
                order = arms[rnd % len(arms) :] + arms[: rnd % len(arms)]
                for arm in order:
                    make, pid = makers[arm]
                    out = Path(profile) / f"{arm}.txt" if profile else None
                    if out is not None:
                        out.parent.mkdir(parents=True, exist_ok=True)
                    async with py_spy(pid, out, args.window + args.warmup):
                        seen = await measure(
                            arm,
                            make(),
                            pid,
                            args.clients,
                            args.max_tokens,
                            args.warmup,
                            args.window,
                        )
                    figures = seen.figures()
                    if not profile:
                        windows[arm].append(figures)
                    label = "profiled" if profile else f"round {rnd + 1}"
                    print(f"{label} {arm}: " + _line(figures), flush=True)
        finally:
            await http.close()
            await client.close()
            await channel.close()
    finally:
        await stack.close()
    summary = {
        "workload": f"{args.clients} clients, {args.max_tokens} tokens/request, greedy, "
        f"{len(ADAPTERS)} adapters, warm-up {args.warmup} s, window {args.window} s",
        "stream_interval": args.stream_interval,
        "windows": windows,
        "medians": {
            arm: {k: median([w[k] for w in ws]) for k in ws[0]} for arm, ws in windows.items() if ws
        },
    }
    print(json.dumps(summary["medians"], indent=1), flush=True)
    return summary


def _line(figures: dict[str, float]) -> str:
    return (
        f"{figures['tokens_per_s']:.0f} tok/s, {figures['tokens_per_message']:.2f} tok/msg, "
        f"CPU ms/1k tok: server {figures['server_cpu_ms_per_1k_tokens']:.1f} "
        f"engine {figures['engine_cpu_ms_per_1k_tokens']:.1f} "
        f"client {figures['client_cpu_ms_per_1k_tokens']:.1f}; "
        f"TTFT p50 {figures['ttft_p50_ms']:.1f} ms, gap p50 {figures['gap_p50_ms']:.1f} ms, "
        f"errors {figures['errors']:.0f}"
    )


_FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+)(?::\d+)?\)$")


def summarize(path: Path, top: int = 25) -> str:
    """A py-spy raw (collapsed) profile by frame: self and inclusive share of samples of
    the thread that ran the event loop most, files shortened to package-relative."""
    self_n: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";") if f]
        total += int(count)
        self_n[frames[-1]] += int(count)
        for frame in set(frames):
            incl[frame] += int(count)
    rows = [f"{total} samples"]
    rows += [f"self {n / total:6.1%}  {frame}" for frame, n in self_n.most_common(top)]
    rows += [f"incl {n / total:6.1%}  {frame}" for frame, n in incl.most_common(top)]
    return "\n".join(rows)


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    file = match["file"]
    for marker in ("site-packages/", "loraserve/", "python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{match['func']} ({file})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_probe", description=__doc__)
    parser.add_argument("--arms", default="grpc,openai,vllm", help=f"from {','.join(ARMS)}")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--stream-interval", type=int, default=0, help="grpc arm's, 0: unset")
    parser.add_argument("--profile", default="", help="py-spy raw profiles here, one per arm")
    parser.add_argument("--loraserve-pythonpath", default="", help="serve loraserve from here")
    parser.add_argument("--json", default="", help="write the windows and medians here")
    parser.add_argument(
        "--results", default=os.path.join(tempfile.gettempdir(), "stream-probe"), help="logs here"
    )
    return parser


if __name__ == "__main__":
    if sys.argv[1:2] == ["summarize"]:
        print(summarize(Path(sys.argv[2])))
    else:
        options = _parser().parse_args()
        found = asyncio.run(run(options))
        if options.json:
            Path(options.json).write_text(json.dumps(found, indent=1))
