"""loraserve's OpenAI front vs `vllm serve`, side by side in one run.

    python -m bench.openai_front [--repeats 3] [--requests 128] [--concurrency 32]
                                 [--max-tokens 64] [--profile out.txt]

Both servers run the same tiny model, the same 8 adapters and the same engine settings
(max_loras 8, rank 8, fp32, eager, KV cache 1 GiB); the same streaming /v1/completions
closed loop (greedy, ignore_eos, prompts as token ids) drives each in turn, the order
rotating every repeat. With --profile, py-spy samples loraserve's server process during
one more run of the workload and writes collapsed stacks there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import tempfile
import time
from pathlib import Path

import psutil

from bench import baselines, procs
from bench.runs import no_failures, openai_arm
from bench.stack import ENGINE_ENV, RANK, Stack, tenant
from bench.stats import median, ratio
from bench.workload import RunResult, Workload
from loraserve.testing.processes import free_port

ENGINE = procs.EngineConfig(max_loras=8, max_cpu_loras=8, max_lora_rank=RANK)
ADAPTERS = tuple(tenant(i) for i in range(8))


async def start_loraserve_front(
    stack: Stack, name: str, pythonpath: str = ""
) -> tuple[procs.Child, str]:
    """`inference serve` with the OpenAI front on (from the source tree `pythonpath`
    names, if given); returns it and the front's URL."""
    grpc_port, http_port = free_port(), free_port()
    argv = [*stack._argv(name, grpc_port, ENGINE), f"--openai-listen=127.0.0.1:{http_port}"]
    env = {**ENGINE_ENV, "PYTHONPATH": pythonpath} if pythonpath else ENGINE_ENV
    child = procs.start_inference(stack.logs, name, argv, f"127.0.0.1:{grpc_port}", env)
    stack.children.append(child)
    return child, f"http://127.0.0.1:{http_port}"


async def _drive(url: str, workload: Workload) -> RunResult:
    # Every workload here names adapters: no request goes to the base model.
    return no_failures(url, await openai_arm(url, base_model="")(workload))


def _cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of the HTTP server's own process, and of its engine children."""
    root = psutil.Process(pid)
    times = root.cpu_times()
    children = 0.0
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child_times = child.cpu_times()
            children += child_times.user + child_times.system
    return times.user + times.system, children


async def _profile(pid: int, out: Path, url: str, workload: Workload) -> None:
    spy = await asyncio.create_subprocess_exec(
        *(str(procs.BIN / "py-spy"), "record", "--format", "raw", "-r", "100"),
        *("-o", str(out), "-p", str(pid)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await asyncio.sleep(1.0)
        await _drive(url, workload)
    finally:
        spy.send_signal(signal.SIGINT)
        await asyncio.wait_for(spy.wait(), 30)


Servers = dict[str, tuple[procs.Child, str]]


async def _start(stack: Stack, baseline_pythonpath: str) -> Servers:
    """loraserve's front (and the baseline code's) and `vllm serve`, all ready: name ->
    (process, URL)."""
    await stack.start_store()
    for name in ADAPTERS:
        await stack.push(name)
    servers = {"loraserve OpenAI front": await start_loraserve_front(stack, "loraserve-front")}
    if baseline_pythonpath:
        servers["loraserve OpenAI front, baseline code"] = await start_loraserve_front(
            stack, "loraserve-front-baseline", baseline_pythonpath
        )
    vllm = baselines.start_serve(
        stack.logs,
        stack.argv("vllm-serve", free_port(), ENGINE),
        {name: stack.adapters[name] for name in ADAPTERS},
        ENGINE_ENV,
    )
    stack.children.append(vllm)
    started = time.monotonic()
    servers["vllm serve"] = (vllm, vllm.address)
    await asyncio.gather(
        *(baselines.http_ready(child, stack.logs, 900, url) for child, url in servers.values())
    )
    print(f"servers ready after {time.monotonic() - started:.0f} s", flush=True)
    return servers


async def _measure(
    servers: Servers, workload: Workload, repeats: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    """Each server in turn, order rotated every repeat: tokens/s, and CPU seconds per
    1000 tokens of its server process and of its engine processes, by server."""
    names = list(servers)
    tps: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    engine_cpu: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(repeats):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            child, url = servers[name]
            before = _cpu(child.process.pid)
            result = await _drive(url, workload)
            after = _cpu(child.process.pid)
            tokens = sum(r.tokens for r in result.ok) / 1000
            tps[name].append(result.tokens_per_s)
            cpu[name].append((after[0] - before[0]) / tokens)
            engine_cpu[name].append((after[1] - before[1]) / tokens)
            print(
                f"rep {rep + 1} {name}: {result.tokens_per_s:.0f} tok/s, "
                f"TTFT p50 {result.ttft_median() * 1000:.0f} ms, CPU s / 1000 tokens: "
                f"server process {cpu[name][-1]:.3f}, engine {engine_cpu[name][-1]:.3f}",
                flush=True,
            )
    return tps, cpu, engine_cpu


async def main(args: argparse.Namespace) -> dict[str, object]:
    results = Path(args.results)
    stack = Stack(results, Path(tempfile.mkdtemp(prefix="bench-front-")))
    try:
        stack.build_models()
        servers = await _start(stack, args.baseline_pythonpath)
        workload = Workload(
            adapters=ADAPTERS,
            concurrency=args.concurrency,
            requests=args.requests,
            max_tokens=args.max_tokens,
        )
        warm = Workload(ADAPTERS, 16, 32, 4)
        for _, url in servers.values():
            await _drive(url, warm)
        tps, cpu, engine_cpu = await _measure(servers, workload, args.repeats)
        base = median(tps["vllm serve"])
        summary: dict[str, object] = {
            "workload": workload.describe(),
            "tokens_per_s": tps,
            "server_process_cpu_s_per_1000_tokens": cpu,
            "engine_processes_cpu_s_per_1000_tokens": engine_cpu,
            "medians": {name: median(v) for name, v in tps.items()},
            "tok/s / vllm serve's (medians)": {
                name: ratio(median(v), base) for name, v in tps.items()
            },
            "server process CPU / vllm serve's (medians)": {
                name: ratio(median(v), median(cpu["vllm serve"])) for name, v in cpu.items()
            },
        }
        print(json.dumps(summary, indent=1), flush=True)
        if args.profile:
            lora, lora_url = servers["loraserve OpenAI front"]
            await _profile(lora.process.pid, Path(args.profile), lora_url, workload)
            print(f"profile: {args.profile}", flush=True)
        return summary
    finally:
        await stack.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.openai_front", description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--profile", default="", help="py-spy collapsed stacks file")
    parser.add_argument(
        "--baseline-pythonpath",
        default="",
        help="also run a loraserve front from this PYTHONPATH (e.g. an older checkout)",
    )
    parser.add_argument(
        "--results", default=str(Path(tempfile.gettempdir()) / "bench-front"), help="logs here"
    )
    return parser


if __name__ == "__main__":
    asyncio.run(main(_parser().parse_args()))
