"""Evidence gatherers that run beside an arm: CPU time per process, and the engine's
running/waiting split as GetServerInfo reports it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import grpc
import psutil

from bench.method.cpu import cpu_seconds
from bench.method.stats import median
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc


def _cpu_seconds(root_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) by role: the server process, each vLLM child by
    name, and this benchmark process (the gRPC client)."""
    out: dict[str, float] = {}
    root = psutil.Process(root_pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            label = "server (frontend)" if proc.pid == root_pid else f"vLLM {proc.name()}"
            used = cpu_seconds(proc.pid)
        except (psutil.Error, OSError):
            continue
        out[label] = out.get(label, 0.0) + used
    out["bench client"] = cpu_seconds(os.getpid())
    return out


@dataclass
class CpuMeter:
    root_pid: int
    used: dict[str, float] = field(default_factory=dict)

    @asynccontextmanager
    async def measure(self) -> AsyncIterator[None]:
        before = _cpu_seconds(self.root_pid)
        yield
        after = _cpu_seconds(self.root_pid)
        self.used = {k: after[k] - before.get(k, 0.0) for k in after}


@dataclass
class LoadSampler:
    """Samples GetServerInfo every 100 ms: requests running in the engine and waiting."""

    address: str
    running: list[int] = field(default_factory=list)
    waiting: list[int] = field(default_factory=list)

    @asynccontextmanager
    async def sampling(self) -> AsyncIterator[None]:
        stop = asyncio.Event()

        async def loop() -> None:
            async with grpc.aio.insecure_channel(self.address) as channel:
                stub = pb_grpc.InferenceServiceStub(channel)
                while not stop.is_set():
                    info = await stub.GetServerInfo(pb.GetServerInfoRequest())
                    if info.running_requests or info.waiting_requests:
                        self.running.append(info.running_requests)
                        self.waiting.append(info.waiting_requests)
                    await asyncio.sleep(0.1)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            stop.set()
            await task

    def summary(self) -> tuple[float, float]:
        return median([float(r) for r in self.running]), median([float(w) for w in self.waiting])
