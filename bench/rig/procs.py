"""The processes the benchmarks run beside themselves: moto's S3 server, `adapterstore
serve`, `inference serve`; started on free loopback ports, logs under results/logs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
import psutil

from loraserve.common.rpc.healthcheck import is_serving
from loraserve.testing.processes.services import free_port

if TYPE_CHECKING:
    from bench.method.report import Report, Section

REGION = "us-east-1"
S3_KEY = "testing"  # moto accepts any credentials
BIN = Path(sys.executable).parent
# `adapterctl`: the console script's entry point (pyproject), run from the code under
# test; an installed console script may predate it (a stale one fails to import).
ADAPTERCTL = (sys.executable, "-m", "loraserve.adapterctl")


@dataclass
class Child:
    """A started process and where it listens."""

    name: str
    process: subprocess.Popen[bytes]
    address: str

    def memory(self) -> tuple[float, float]:
        """(RSS, USS) in MiB of the process and all its descendants."""
        return tree_memory(self.process.pid)

    def stop(self, timeout: float = 20.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                child.kill()
            self.process.kill()
            self.process.wait()


def tree_memory(pid: int) -> tuple[float, float]:
    """(RSS, USS) in MiB summed over a process tree. USS counts only pages no other
    process maps, so it is what one more such process would cost."""
    root = psutil.Process(pid)
    rss = uss = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        rss += info.rss
        uss += info.uss
    return rss / 2**20, uss / 2**20


def _spawn(
    name: str,
    argv: list[str],
    log_dir: Path,
    env: dict[str, str] | None = None,
    *,
    stdin: int = subprocess.DEVNULL,
    pass_fds: tuple[int, ...] = (),
) -> Child:
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            pass_fds=pass_fds,
            env={**os.environ, **(env or {})},
        )
    return Child(name, process, "")


def _check_alive(child: Child, log_dir: Path) -> None:
    if child.process.poll() is not None:
        tail = (log_dir / f"{child.name}.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{child.name} exited with {child.process.returncode}:\n{tail}")


def moto_argv(port: int) -> list[str]:
    return [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]


def start_moto(log_dir: Path, bucket: str) -> tuple[Child, str]:
    """moto's S3 server in its own process (so it never shares a GIL with the store)."""
    port = free_port()
    child = _spawn("moto", moto_argv(port), log_dir)
    endpoint = f"http://127.0.0.1:{port}"
    client = s3_client(endpoint)
    deadline = time.monotonic() + 30
    try:
        while True:
            _check_alive(child, log_dir)
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    except BaseException:
        # The caller gets no handle to stop it with.
        child.stop()
        raise
    child.address = endpoint
    return child, endpoint


def s3_client(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_KEY,
    )


async def wait_serving(child: Child, log_dir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(is_serving, child.address, 2.0):
        _check_alive(child, log_dir)
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.name} not SERVING after {timeout:.0f} s")
        await asyncio.sleep(0.3)


def store_argv(port: int, endpoint: str, bucket: str, log_level: str = "WARNING") -> list[str]:
    return [
        str(BIN / "adapterstore"),
        "serve",
        f"--listen=127.0.0.1:{port}",
        f"--s3-endpoint={endpoint}",
        f"--bucket={bucket}",
        f"--region={REGION}",
        f"--access-key-id={S3_KEY}",
        f"--secret-access-key={S3_KEY}",
        f"--log-level={log_level}",
    ]


async def start_store(
    log_dir: Path,
    endpoint: str,
    bucket: str,
    log_level: str = "WARNING",
    name: str = "adapterstore",
    extra: tuple[str, ...] = (),
) -> Child:
    """`adapterstore serve` on the bucket (with `extra` flags), SERVING; its log is
    `name`.log."""
    port = free_port()
    child = _spawn(name, [*store_argv(port, endpoint, bucket, log_level), *extra], log_dir)
    child.address = f"127.0.0.1:{port}"
    await wait_serving(child, log_dir, 60)
    return child


@dataclass(frozen=True)
class EngineConfig:
    """The engine flags a benchmark server runs with."""

    max_loras: int
    max_cpu_loras: int
    max_lora_rank: int = 8
    max_model_len: int = 512
    # None: vLLM's default (the CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE);
    # on a GPU each engine gets a share, as several run on one device at once.
    gpu_memory_utilization: float | None = None


def serve_argv(
    name: str,
    port: int,
    *,
    model: Path,
    store: str,
    cache_dir: Path,
    engine: EngineConfig,
    openai_port: int | None = None,
) -> list[str]:
    """`inference serve` flags for a benchmark server (with the OpenAI front on
    `openai_port` when given)."""
    return [
        "serve",
        f"--model={model}",
        f"--store={store}",
        f"--adapter-cache={cache_dir}",
        f"--replica-id={name}",
        f"--listen=127.0.0.1:{port}",
        f"--max-loras={engine.max_loras}",
        f"--max-cpu-loras={engine.max_cpu_loras}",
        f"--max-lora-rank={engine.max_lora_rank}",
        f"--max-model-len={engine.max_model_len}",
        "--dtype=float32",
        *(
            [f"--gpu-memory-utilization={engine.gpu_memory_utilization}"]
            if engine.gpu_memory_utilization is not None
            else []
        ),
        "--max-pending-requests=4096",
        # Graph capture buys nothing for a model this small on a CPU and slows start-up.
        "--engine-arg=enforce_eager=true",
        "--engine-arg=seed=0",
        "--log-level=WARNING",
        *([f"--openai-listen=127.0.0.1:{openai_port}"] if openai_port is not None else []),
    ]


def start_inference(
    log_dir: Path,
    name: str,
    argv: list[str],
    address: str,
    env: dict[str, str],
    command: Sequence[str] = (),
) -> Child:
    """`inference serve ARGV`, the product's own entry point (or `command` taking the same
    flags); wait_serving() it before use."""
    child = _spawn(name, [*(command or [str(BIN / "inference")]), *argv], log_dir, env)
    child.address = address
    return child


def start_engine_host(
    log_dir: Path, name: str, argv: list[str], address: str, env: dict[str, str]
) -> tuple[Child, int]:
    """bench.rig.engine_host with the same flags: the real server plus in-process control.
    Returns the child and the read end of its control pipe."""
    read_fd, write_fd = os.pipe()
    child = _spawn(
        name,
        [sys.executable, "-m", "bench.rig.engine_host", f"--control-fd={write_fd}", *argv],
        log_dir,
        env,
        stdin=subprocess.PIPE,
        pass_fds=(write_fd,),
    )
    os.close(write_fd)
    child.address = address
    return child, read_fd


@contextlib.asynccontextmanager
async def moto_section(
    report: Report, section: Section, bucket: str, prefix: str
) -> AsyncIterator[tuple[str, Path]]:
    """moto's server (its endpoint) and a scratch directory for one benchmark section;
    on the way out both go, and the section gets its error, its time and its print."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=prefix))
    moto, endpoint = await asyncio.to_thread(start_moto, report.results_dir / "logs", bucket)
    try:
        yield endpoint, work
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
        section.seconds = time.monotonic() - started
        report.print_section(section)
