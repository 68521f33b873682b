"""What one streamed gRPC message costs a Python server, with no engine: the floor under
Generate's CPU per token, for several server architectures side by side.

    python -m bench.front.grpc_floor [--variants aio,sync,bridge,...] [--mode paced,closed]
        [--streams 32] [--messages 64] [--step-ms 15] [--warmup 3] [--window 8]
        [--rounds 3] [--json OUT]
    python -m bench.front.grpc_floor table OUT [REFERENCE]   # a --json file's table again

Each run starts one server process (bench/front/grpc_floor_servers.py says what each VARIANT
is), then this process opens `--streams` concurrent Generate calls on one grpc.aio
channel (uvloop) to 127.0.0.1, each calling again as soon as its last call ended (a
closed loop), `--messages` one-token messages a call. After `--warmup` seconds the
server process's CPU time (psutil, user + system) and this process's are read over
`--window` seconds and divided by the messages received in it: µs per message. Modes:
`paced` (every open stream gets one token per `--step-ms`, as from an engine step: the
same load for every variant) and `closed` (as fast as the transport takes them). Runs
alternate variants, their order rotating each round; the table gives each variant's
median and range over the rounds, and its ratio to the first variant's run of the same
round (median and range); `table` prints a --json file's table again, the ratios to
REFERENCE if given.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import psutil
import uvloop

from bench.front.grpc_floor_servers import VARIANTS, Shape, serve
from bench.method.stats import median
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc


@dataclass
class Run:
    """One measured window of one variant."""

    variant: str
    mode: str
    round: int
    pid: int = 0
    messages: int = 0
    seconds: float = 0.0
    server_cpu_s: float = 0.0
    # Of which in the kernel (loopback TCP: the receiver's side of each send counts too).
    server_sys_s: float = 0.0
    client_cpu_s: float = 0.0
    errors: int = 0

    @property
    def server_us(self) -> float:
        return self.server_cpu_s / max(self.messages, 1) * 1e6

    @property
    def server_sys_us(self) -> float:
        return self.server_sys_s / max(self.messages, 1) * 1e6

    @property
    def client_us(self) -> float:
        return self.client_cpu_s / max(self.messages, 1) * 1e6

    @property
    def rate(self) -> float:
        return self.messages / max(self.seconds, 1e-9)


def _cpu(process: psutil.Process) -> tuple[float, float]:
    """User + system seconds of the process (children excluded), and system seconds."""
    times = process.cpu_times()
    return float(times.user + times.system), float(times.system)


async def _drive(address: str, run: Run, args: argparse.Namespace) -> None:
    """The closed loop of `args.streams` calls; counts the window's messages."""
    bounds = [float("inf"), float("inf")]
    request = pb.GenerateRequest(
        adapter="tenant-0", sampling=pb.SamplingParams(max_tokens=args.messages)
    )
    request.token_ids.ids.extend(range(16))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.InferenceServiceStub(channel)

        async def worker() -> None:
            while True:
                try:
                    async for _ in stub.Generate(request):
                        if bounds[0] <= time.monotonic() < bounds[1]:
                            run.messages += 1
                except grpc.aio.AioRpcError:
                    if bounds[0] <= time.monotonic() < bounds[1]:
                        run.errors += 1

        await channel.channel_ready()
        workers = [asyncio.create_task(worker()) for _ in range(args.streams)]
        try:
            server = psutil.Process(run.pid)
            await asyncio.sleep(args.warmup)
            server0, client0 = _cpu(server), time.process_time()
            bounds[0] = time.monotonic()
            bounds[1] = bounds[0] + args.window
            spy = _py_spy(run, args)
            await asyncio.sleep(args.window)
            server1, client1 = _cpu(server), time.process_time()
            run.seconds = time.monotonic() - bounds[0]
            if spy is not None:
                spy.wait()
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
    run.server_cpu_s = server1[0] - server0[0]
    run.server_sys_s = server1[1] - server0[1]
    run.client_cpu_s = client1 - client0


def _py_spy(run: Run, args: argparse.Namespace) -> subprocess.Popen[bytes] | None:
    """With --profile, py-spy records the server over the window (its figures then count
    py-spy's own load: compare profiles, not those)."""
    if not args.profile:
        return None
    out = Path(args.profile) / f"{run.mode}-{run.variant}-{run.round}.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(Path(sys.executable).parent / "py-spy"), "record", "--format", "raw"]
    argv += ["-r", "200", "--duration", str(int(args.window)), "-o", str(out), "-p", str(run.pid)]
    argv += ["--native"] if args.native else []
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def served(variant: str, mode: str, args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    """The variant's server process, listening: its address and pid; killed on exit."""
    argv = [sys.executable, "-m", "bench.front.grpc_floor", "serve", variant, "--mode", mode]
    argv += ["--messages", str(args.messages), "--step-ms", str(args.step_ms)]
    argv += ["--streams", str(args.streams)]
    env = {**os.environ, **dict(VARIANTS[variant].env)}
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        yield f"127.0.0.1:{port}", server.pid
    finally:
        server.kill()
        server.wait()


def _one(variant: str, mode: str, rnd: int, args: argparse.Namespace) -> Run:
    """Starts the variant's server, measures one window, stops it."""
    with served(variant, mode, args) as (address, pid):
        run = Run(variant, mode, rnd, pid)
        uvloop.run(_drive(address, run, args))
        return run


def _table(runs: list[Run], reference: str) -> str:
    rows = [
        "| mode | variant | server µs/msg median (range) "
        f"| x {reference} (range) | of which sys | client µs/msg | msgs/s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    by_key: dict[tuple[str, str], list[Run]] = {}
    for run in runs:
        by_key.setdefault((run.mode, run.variant), []).append(run)
    for (mode, variant), mine in by_key.items():
        refs = {r.round: r.server_us for r in by_key.get((mode, reference), [])}
        ratios = [r.server_us / refs[r.round] for r in mine if r.round in refs]
        server = [r.server_us for r in mine]
        rows.append(
            f"| {mode} | {variant} | {median(server):.0f} ({min(server):.0f}-{max(server):.0f}) "
            f"| {median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {median([r.server_sys_us for r in mine]):.0f} "
            f"| {median([r.client_us for r in mine]):.0f} "
            f"| {median([r.rate for r in mine]):.0f} | {sum(r.errors for r in mine)} |"
        )
    return "\n".join(rows)


def main(args: argparse.Namespace) -> None:
    variants = [v for v in args.variants.split(",") if v]
    if unknown := set(variants) - set(VARIANTS):
        raise SystemExit(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    runs: list[Run] = []
    for mode in args.mode.split(","):
        for rnd in range(args.rounds):
            for variant in variants[rnd % len(variants) :] + variants[: rnd % len(variants)]:
                if mode == "closed" and variant == "bridge-rcts":
                    continue
                run = _one(variant, mode, rnd, args)
                runs.append(run)
                print(
                    f"{mode} round {rnd + 1} {variant}: server {run.server_us:.0f} µs/msg "
                    f"(sys {run.server_sys_us:.0f}), "
                    f"client {run.client_us:.0f} µs/msg, {run.rate:.0f} msgs/s, "
                    f"errors {run.errors}",
                    flush=True,
                )
    print(_table(runs, variants[0]))
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "runs": [asdict(r) for r in runs]}, indent=1)
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.front.grpc_floor", description=__doc__)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="the first is the reference")
    parser.add_argument("--mode", default="paced,closed")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--messages", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default="")
    parser.add_argument("--profile", default="", help="py-spy raw profiles here, one per run")
    parser.add_argument("--native", action="store_true", help="py-spy --native (C frames)")
    return parser


def table_of(path: Path, reference: str = "") -> str:
    """The table of a --json file, ratios to `reference` (default: its first variant)."""
    found = json.loads(path.read_text())
    runs = [Run(**run) for run in found["runs"]]
    reference = reference or found["args"]["variants"].split(",")[0]
    if reference not in {run.variant for run in runs}:
        raise SystemExit(f"{path} has no runs of {reference!r}")
    return _table(runs, reference)


if __name__ == "__main__":
    if sys.argv[1:2] == ["table"]:
        print(table_of(Path(sys.argv[2]), *sys.argv[3:4]))
    elif sys.argv[1:2] == ["serve"]:
        options = build_parser().parse_args(sys.argv[3:])
        shape = Shape(options.messages, options.mode == "paced", options.step_ms / 1000)
        serve(sys.argv[2], shape, options.streams)
    else:
        main(build_parser().parse_args())
