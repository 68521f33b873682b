"""A replica and a store, each in a process of its own, for the full-size abuse suite
(`make abuse`): tokens for a normal client and for an attacker, every limit at its
default (on the replica, the OpenAI front and the metrics port on, the transport a test
names); and what a normal client of each sees."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
from grpc_health.v1 import health_pb2

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_pb_grpc
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.attack_figures import PeakMemory
from loraserve.testing.inference.app import adapter_files, greedy
from loraserve.testing.processes.services import (
    InferenceProcess,
    StoreProcess,
    free_port,
    health_status,
    inference_process,
    store_process,
)
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.waiting import eventually

TOKEN = "abuse-reader-token"
WRITER_TOKEN = "abuse-writer-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
ADAPTER = "alpha"
SERVING = int(health_pb2.HealthCheckResponse.SERVING)
# An attacker that holds a reader token of its own, and asks for an adapter of its own:
# what it may run is what any caller with a token may, admitted beside the normal client
# by the replica's fair admission (per adapter), not in its place.
ATTACKER_TOKEN = "abuse-attacker-token"
ATTACKER_ADAPTER = "beta"
# A normal client's request: a few tokens, greedy.
NORMAL_TOKENS = 8


@dataclass
class AbusedReplica:
    """The replica under attack and a normal client's channel to it."""

    process: InferenceProcess
    label: str
    port: int
    openai_port: int
    metrics_port: int
    channel: grpc.aio.Channel

    @property
    def memory(self) -> PeakMemory:
        return PeakMemory(self.pid)

    @property
    def pid(self) -> int:
        return self.process.process.pid

    async def probe(self) -> float:
        """One normal Generate, read to its end; seconds to its first token."""
        stub = pb_grpc.InferenceServiceStub(self.channel)
        started = time.monotonic()
        first = 0.0
        async for message in stub.Generate(
            greedy(ADAPTER, NORMAL_TOKENS), metadata=AUTH, timeout=60
        ):
            if message.token_ids and not first:
                first = time.monotonic() - started
        return first

    async def serving(self) -> bool:
        """Whether Health says SERVING."""
        return await health_status(self.process.address) == SERVING

    async def nothing_held(self, port: int) -> None:
        """Waits until no sequence is admitted and the server holds no connection on
        `port` but the normal client's."""
        stub = pb_grpc.InferenceServiceStub(self.channel)

        async def idle() -> bool:
            load = await stub.GetReplicaLoad(pb.GetReplicaLoadRequest(), metadata=AUTH, timeout=10)
            return bool(load.pending_sequences == 0)

        await eventually(idle, "no sequence admitted")
        normal = 1 if port == self.port else 0
        await eventually(
            lambda: established(self.pid, port) <= normal, f"no attacker's connection on {port}"
        )


def established(pid: int, port: int) -> int:
    """Connections process `pid` holds open on its listening `port`."""
    return sum(
        1
        for conn in psutil.Process(pid).net_connections(kind="tcp")
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_ESTABLISHED
    )


@asynccontextmanager
async def abused_replica(
    transport: str,
    store_address: str,
    model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    directory: Path,
) -> AsyncIterator[AbusedReplica]:
    """`inference serve` on `transport`, serving `alpha`, its normal client connected."""
    async with store_stub(store_address) as stub:
        await push(stub, ADAPTER, adapter_files(tiny_adapter(seed=1)))
        await push(stub, ATTACKER_ADAPTER, adapter_files(tiny_adapter(seed=2)))
    openai_port, metrics_port = free_port(), free_port()
    async with inference_process(
        model_dir,
        store_address,
        directory / "cache",
        directory / f"inference-{transport}.log",
        extra=[
            "--grpc-transport",
            transport,
            "--reader-token",
            f"normal:{TOKEN},attacker:{ATTACKER_TOKEN}",
            "--openai-listen",
            f"127.0.0.1:{openai_port}",
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
        ],
    ) as process:
        port = int(process.address.rsplit(":", 1)[1])
        async with grpc.aio.insecure_channel(process.address) as channel:
            replica = AbusedReplica(process, transport, port, openai_port, metrics_port, channel)

            async def generates() -> bool:
                try:
                    await replica.probe()
                except grpc.aio.AioRpcError:
                    return False
                return True

            await eventually(generates, f"{ADAPTER} served")
            yield replica


@dataclass
class AbusedStore:
    """The adapter store under attack, in a process of its own, and a normal reader's
    channel to it."""

    process: StoreProcess
    channel: grpc.aio.Channel
    label: str = "store"

    @property
    def port(self) -> int:
        return self.process.port

    @property
    def memory(self) -> PeakMemory:
        return PeakMemory(self.process.process.pid)

    async def probe(self) -> float:
        """One GetAdapter of `alpha`; its seconds."""
        stub = store_pb_grpc.AdapterStoreServiceStub(self.channel)
        started = time.monotonic()
        await stub.GetAdapter(store_pb.GetAdapterRequest(name=ADAPTER), metadata=AUTH, timeout=30)
        return time.monotonic() - started

    async def serving(self) -> bool:
        """Whether Health says SERVING."""
        return await health_status(self.process.address) == SERVING

    async def nothing_held(self, port: int) -> None:
        """Waits until the store holds no connection on `port` but the normal client's."""
        pid = self.process.process.pid
        await eventually(lambda: established(pid, port) <= 1, f"no attacker's connection on {port}")


@asynccontextmanager
async def abused_store(
    bucket: S3Bucket, tiny_adapter: TinyAdapterFactory, directory: Path
) -> AsyncIterator[AbusedStore]:
    """`adapterstore serve` with a reader and a writer token, holding `alpha` and the
    attacker's `beta`, every limit at its default; its normal client connected."""
    tokens = f"normal:{TOKEN},attacker:{ATTACKER_TOKEN}"
    async with store_process(
        bucket,
        directory / "store.log",
        extra=["--reader-token", tokens, "--writer-token", f"writer:{WRITER_TOKEN}"],
    ) as process:
        writer = (("authorization", f"Bearer {WRITER_TOKEN}"),)
        async with grpc.aio.insecure_channel(process.address) as channel:
            stub = store_pb_grpc.AdapterStoreServiceStub(channel)
            for name, seed in ((ADAPTER, 1), (ATTACKER_ADAPTER, 2)):
                files = adapter_files(tiny_adapter(seed=seed))
                await stream_unary(
                    stub.PushAdapter, push_requests(name, files), metadata=writer, timeout=60
                )
            yield AbusedStore(process, channel)
