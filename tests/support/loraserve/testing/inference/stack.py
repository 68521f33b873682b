"""The reliability suite's whole stack on the session's engine: a store server that reaches
S3 through a fault proxy, and an in-process inference server synced to it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import RunningInference, adapter_files, inference_app
from loraserve.testing.s3.faults import S3FaultProxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import GUARD_S

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

REPLICA = "reliability-replica"


@dataclass
class Stack:
    """A store reached through an S3 fault proxy, and an inference server synced to it."""

    store: RunningStore
    proxy: S3FaultProxy
    inference: RunningInference
    cache: Path

    async def push(self, name: str, files: AdapterFiles, **header: Any) -> int:
        async with store_stub(self.store.address) as stub:
            response = await push(stub, name, files, **header)
        return int(response.revision.revision)

    async def set_current(self, name: str, revision: int) -> None:
        async with store_stub(self.store.address) as stub:
            await stub.SetCurrentRevision(
                store_pb.SetCurrentRevisionRequest(name=name, revision=revision)
            )

    async def delete(self, name: str) -> None:
        async with store_stub(self.store.address) as stub:
            await stub.DeleteAdapter(store_pb.DeleteAdapterRequest(name=name))

    async def report(self, name: str, revision: int) -> store_pb.ReplicaAdapterStatus:
        return await replica_answer(self.store.address, REPLICA, name, revision)

    def blob_gets(self, key: str) -> int:
        """How many times the store has read blob `key` from S3."""
        return self.proxy.requests.count(("GET", key))


async def replica_answer(
    store_address: str, replica_id: str, name: str, revision: int
) -> store_pb.ReplicaAdapterStatus:
    """The replica's answer about `name`@`revision` (an ACK or a NACK) as the store shows
    it, once it has made one; a revision still on its way in is no answer yet."""
    async with store_stub(store_address) as stub, asyncio.timeout(GUARD_S):
        while True:
            response = await stub.GetAdapterStatus(store_pb.GetAdapterStatusRequest(name=name))
            for status in response.statuses:
                if (
                    status.replica_id == replica_id
                    and status.reported_revision == revision
                    and status.type != store_pb.REPORT_TYPE_UNSPECIFIED
                ):
                    found: store_pb.ReplicaAdapterStatus = status
                    return found
            await asyncio.sleep(0.05)


@pytest.fixture
async def serving_stack(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    proxied_store: RunningStore,
    fault_proxy: S3FaultProxy,
    tmp_path: Path,
) -> AsyncIterator[Stack]:
    """Adapter `alpha` revision 1 (tiny adapter seed 1) pushed and served."""
    cache = tmp_path / "cache"
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=proxied_store.address,
        cache_dir=cache,
        replica_id=REPLICA,
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
        # The suite pins revisions that are no longer (or not yet) current.
        extra=("--pin-policy", "any"),
    ) as inference:
        yield Stack(proxied_store, fault_proxy, inference, cache)
