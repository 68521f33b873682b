"""loraserve's OpenAI front vs `vllm serve`, side by side in one run: a tool for the
engineer working on a front (benchmark 13 is the committed comparison).

    python -m bench.front.openai_front [--repeats 5] [--concurrency 32] [--max-tokens 64]
                                 [--window 10] [--profile out.txt]
                                 [--baseline-pythonpath OTHER_CHECKOUT]

Both servers run the same tiny model, the same 8 adapters and the same engine settings
(max_loras 8, rank 8, fp32, eager, KV cache 1 GiB); the same streaming /v1/completions
closed loop (greedy, ignore_eos, prompts as token ids) drives each in turn from the load
generator's own process, the order rotating every repeat, and each window records the
server process's CPU per 1,000 tokens. With --profile, py-spy samples loraserve's server
process during one more window and writes collapsed stacks there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import tempfile
import time
from pathlib import Path

from bench.load.drive import Timing
from bench.load.loadclient import Arm, LoadGenerator
from bench.load.targets import Target
from bench.load.workload import Workload
from bench.method import paired
from bench.method.runs import closed
from bench.rig import baselines, procs
from bench.rig.stack import ENGINE_ENV, RANK, Stack, tenant
from loraserve.testing.processes.services import free_port

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


async def _profile(pid: int, out: Path, gen: LoadGenerator, arm: Arm, timing: Timing) -> None:
    spy = await asyncio.create_subprocess_exec(
        *(str(procs.BIN / "py-spy"), "record", "--format", "raw", "-r", "100"),
        *("-o", str(out), "-p", str(pid)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await asyncio.sleep(1.0)
        await gen.run(arm, timing)
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


async def main(args: argparse.Namespace) -> dict[str, object]:
    results = Path(args.results)
    stack = Stack(results, Path(tempfile.mkdtemp(prefix="bench-front-")))
    gen = LoadGenerator(stack.logs)
    try:
        await gen.start()
        stack.build_models()
        servers = await _start(stack, args.baseline_pythonpath)
        workload = Workload(ADAPTERS, args.concurrency, 256, args.max_tokens)
        arms = [
            closed(name, Target("openai", url), workload, args.concurrency, child.process.pid)
            for name, (child, url) in servers.items()
        ]
        timing = Timing(args.warmup, args.window)
        runs = await paired.paired(gen, arms, timing, args.repeats)
        summary: dict[str, object] = {
            "workload": arms[0].describe(),
            "tokens_per_s": {a: runs.estimate(a, "tokens_per_s").text(".0f") for a in runs.windows},
            "server_process_cpu_ms_per_1000_tokens": {
                a: runs.estimate(a, "front_cpu_ms_per_1k").text(".0f") for a in runs.windows
            },
            "server process CPU / vllm serve's": {
                a: runs.ratio(a, "vllm serve", "front_cpu_ms_per_1k").text(".2f")
                for a in runs.windows
            },
        }
        print(json.dumps(summary, indent=1), flush=True)
        if args.profile:
            lora = servers["loraserve OpenAI front"][0]
            await _profile(lora.process.pid, Path(args.profile), gen, arms[0], timing)
            print(f"profile: {args.profile}", flush=True)
        return summary
    finally:
        await gen.close()
        await stack.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.front.openai_front", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds discarded per run")
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured per run")
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
