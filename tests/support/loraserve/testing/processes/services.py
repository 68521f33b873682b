"""`adapterstore serve` and `inference serve` as real child processes a test can
SIGTERM or SIGKILL.

The process listens on a port chosen up front, so a restarted store comes back at
the same address and clients reconnect as they would in production. Its log goes
to a file beside the test's other files, named in failures.

Each child leads a process group of its own, and leaving the block kills the whole
group, as a container runtime kills a pod: `inference serve` starts vLLM engine
processes that would otherwise outlive a SIGKILLed server and hold gigabytes for
the rest of the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.testing.engine.session import ENGINE_ENV
from loraserve.testing.engine.starts import engine_starting
from loraserve.testing.s3.endpoint import S3Bucket

# Guards against a hang only; nothing here measures time.
START_GUARD_S = 60.0


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Linux's default; the IANA range starts higher still.
_EPHEMERAL_LOW = 32768
_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server started later on a fixed address.

    It lies below the kernel's ephemeral range: a port the kernel picks (a server on port
    0, an outgoing connection to S3 or between engine processes) would otherwise take it
    between this check and the server's bind. No port is handed out twice per process.
    """
    low = _ephemeral_low()
    for _ in range(1000):
        port = random.randrange(low // 2, low)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port below {low} on {host}")


def _ephemeral_low() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW


ChannelFactory = Callable[[str], grpc.aio.Channel]


def insecure(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address)


async def health_status(address: str, channel: ChannelFactory = insecure) -> int:
    """The overall health status, or -1 when the server does not answer."""
    async with channel(address) as ch:
        try:
            response = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(), timeout=2
            )
        except grpc.aio.AioRpcError:
            return -1
        return int(response.status)


async def wait_for_health(
    address: str, status: int, channel: ChannelFactory = insecure, guard_s: float = START_GUARD_S
) -> None:
    async with asyncio.timeout(guard_s):
        while True:
            if await health_status(address, channel) == status:
                return
            await asyncio.sleep(0.1)


@dataclass
class ChildProcess:
    """A server running as a child process, with its log file."""

    process: asyncio.subprocess.Process
    log_path: Path

    def terminate(self) -> None:
        """SIGTERM: the graceful shutdown path."""
        self.process.send_signal(signal.SIGTERM)

    async def wait(self, guard_s: float = START_GUARD_S) -> int:
        async with asyncio.timeout(guard_s):
            return await self.process.wait()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def kill_group(self) -> None:
        """SIGKILL to the child and every process it started."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await self.wait()


@dataclass
class StoreProcess(ChildProcess):
    """A running `adapterstore serve` child."""

    address: str
    port: int

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        self.process.send_signal(signal.SIGKILL)


def store_args(
    bucket: S3Bucket,
    listen: str,
    endpoint_url: str | None = None,
    extra: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """A command line for a store on `bucket`, tuned for tests (fast polls and heartbeats),
    run by `python` (another release's, say)."""
    return [
        python,
        "-m",
        "loraserve.adapterstore",
        "serve",
        "--listen",
        listen,
        "--s3-endpoint",
        endpoint_url or bucket.endpoint_url,
        "--bucket",
        bucket.bucket,
        "--region",
        bucket.region,
        "--access-key-id",
        bucket.access_key_id,
        "--secret-access-key",
        bucket.secret_access_key,
        "--poll-interval",
        "0.05",
        "--heartbeat-interval",
        "0.5",
        "--log-retention",
        "0",
        *extra,
    ]


def inference_args(
    model_dir: Path, store_address: str, cache_dir: Path, *extra: str, listen: str = "127.0.0.1:0"
) -> list[str]:
    """`inference serve` flags for a model, a store and an adapter cache (what a test varies
    goes in `extra`)."""
    return [
        "serve",
        "--model",
        str(model_dir),
        "--store",
        store_address,
        "--listen",
        listen,
        "--adapter-cache",
        str(cache_dir),
        *extra,
    ]


@dataclass
class InferenceProcess(ChildProcess):
    """A running `inference serve` child (it starts its own vLLM engine)."""

    address: str


@asynccontextmanager
async def inference_process(
    model_dir: Path,
    store_address: str,
    cache_dir: Path,
    log_path: Path,
    *,
    extra: Sequence[str] = (),
    guard_s: float = 300.0,
    module: str = "loraserve.inference",
    env: Mapping[str, str] | None = None,
    python: str = sys.executable,
) -> AsyncIterator[InferenceProcess]:
    """Starts `inference serve` on the tiny model (SERVING before the block runs) and
    kills it when the block exits, if it still runs. `module` runs instead of
    `loraserve.inference` (a launcher of it), with `env` added to the environment, by
    `python` (another release's, say)."""
    address = f"127.0.0.1:{free_port()}"
    args = [
        python,
        "-m",
        module,
        *inference_args(model_dir, store_address, cache_dir, listen=address),
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
        "--max-loras",
        "2",
        "--max-lora-rank",
        "16",
        "--engine-arg",
        "enforce_eager=true",
        *extra,
    ]
    environment = os.environ | ENGINE_ENV | dict(env or {})
    async with engine_starting():
        with log_path.open("ab") as log_file:
            process = await asyncio.create_subprocess_exec(
                *args, stdout=log_file, stderr=log_file, env=environment, start_new_session=True
            )
        running = InferenceProcess(process, log_path, address)
        try:
            await _serving_or_exited(running, guard_s)
        except BaseException:
            await running.kill_group()
            raise
    try:
        yield running
    finally:
        await running.kill_group()


async def _serving_or_exited(running: InferenceProcess, guard_s: float) -> None:
    """Waits until the server is SERVING; fails at once if it exits first."""
    serving = asyncio.ensure_future(
        wait_for_health(running.address, health_pb2.HealthCheckResponse.SERVING, guard_s=guard_s)
    )
    exited = asyncio.ensure_future(running.process.wait())
    try:
        await asyncio.wait({serving, exited}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (serving, exited):
            task.cancel()
        await asyncio.gather(serving, exited, return_exceptions=True)
    if serving.done() and not serving.cancelled() and serving.exception() is None:
        return
    if exited.done() and not exited.cancelled():
        raise AssertionError(
            f"inference exited with code {exited.result()} before serving; "
            f"log:\n{running.log_text()}"
        )
    raise AssertionError(f"inference never served; log:\n{running.log_text()}")


@asynccontextmanager
async def store_process(
    bucket: S3Bucket,
    log_path: Path,
    *,
    port: int | None = None,
    endpoint_url: str | None = None,
    extra: Sequence[str] = (),
    channel: ChannelFactory = insecure,
    wait_serving: bool = True,
    python: str = sys.executable,
) -> AsyncIterator[StoreProcess]:
    """Starts a store process (SERVING before the block runs unless told not to wait)
    and kills it when the block exits, if it still runs; `python` runs it."""
    port = port or free_port()
    address = f"127.0.0.1:{port}"
    with log_path.open("ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            *store_args(bucket, address, endpoint_url, extra, python),
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,
        )
    running = StoreProcess(process, log_path, address, port)
    try:
        if wait_serving:
            try:
                await wait_for_health(address, health_pb2.HealthCheckResponse.SERVING, channel)
            except TimeoutError:
                raise AssertionError(f"store never served; log:\n{running.log_text()}") from None
        yield running
    finally:
        await running.kill_group()
