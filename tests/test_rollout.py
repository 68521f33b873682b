"""Canary rollouts on a real inference replica (issue 25, item 3): the real vLLM engine
(CPU build), a real store over gRPC and S3 (moto). The split's share of 1,000
requests, one revision per caller key, and promote and abort moving every request.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.inference.adapters.rollouts import ROLLOUT_KEY_HEADER
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import RunningInference, adapter_files, greedy, inference_app
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

REQUESTS = 1000
# Requests in flight at once: enough to keep the engine's batch full.
CONCURRENCY = 32


class Rollout:
    """alpha@1 current and alpha@2 pushed, on a store and one replica following it."""

    def __init__(self, store: store_grpc.AdapterStoreServiceStub, replica: RunningInference):
        self.store = store
        self.replica = replica

    async def served(self, key: str = "") -> int:
        """The revision that served one request for alpha (with the caller key `key`)."""
        metadata = ((ROLLOUT_KEY_HEADER, key),) if key else ()
        revision = 0
        async for message in self.replica.stub.Generate(
            greedy("alpha", 1), metadata=metadata, timeout=60
        ):
            revision = revision or message.revision
        return int(revision)

    async def served_many(self, keys: list[str]) -> Counter[int]:
        limit = asyncio.Semaphore(CONCURRENCY)

        async def one(key: str) -> int:
            async with limit:
                return await self.served(key)

        return Counter(await asyncio.gather(*(one(k) for k in keys)))

    async def applied(self, weight: float | None) -> None:
        """Waits until the replica splits at `weight` (None: no rollout)."""

        async def splits() -> bool:
            candidate = (await self.replica.statuses("alpha")).get(2)
            if weight is None:
                return candidate is None or not candidate.candidate
            return candidate is not None and candidate.rollout_weight == weight

        await eventually(splits, f"the replica splits alpha at {weight}")

    async def start(self, weight: float) -> None:
        guards = store_pb.RolloutGuards(abort_on_nack=True)
        request = store_pb.StartRolloutRequest(
            name="alpha", revision=2, weight=weight, guards=guards
        )
        await self.store.StartRollout(request)
        await self.applied(weight)


@pytest.fixture
async def rollout(
    store_server: RunningStore,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
) -> AsyncIterator[Rollout]:
    async with grpc.aio.insecure_channel(store_server.address) as channel:
        stub = store_grpc.AdapterStoreServiceStub(channel)
        await push(stub, "alpha", adapter_files(tiny_adapter(seed=1)))
        await push(stub, "alpha", adapter_files(tiny_adapter(seed=2)), no_promote=True)
        async with inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=store_server.address,
            cache_dir=tmp_path / "cache",
        ) as replica:
            yield Rollout(stub, replica)


async def test_weight_20_sends_20_percent_of_1000_requests_to_the_candidate(
    rollout: Rollout,
) -> None:
    await rollout.start(20)
    served = await rollout.served_many([""] * REQUESTS)
    assert set(served) == {1, 2}
    assert abs(served[2] / REQUESTS - 0.20) <= 0.03


async def test_one_caller_key_always_gets_the_same_revision(rollout: Rollout) -> None:
    await rollout.start(50)
    keys = [f"user-{i}" for i in range(20)]
    served = {key: await rollout.served_many([key] * 5) for key in keys}
    assert all(len(revisions) == 1 for revisions in served.values())
    assert {next(iter(revisions)) for revisions in served.values()} == {1, 2}


async def test_promote_sends_every_request_to_the_candidate(rollout: Rollout) -> None:
    await rollout.start(20)
    await rollout.store.PromoteRollout(store_pb.PromoteRolloutRequest(name="alpha"))
    await eventually(lambda: _current_is(rollout.replica, 2), "the replica routes alpha@2")
    assert await rollout.served_many([""] * 100 + [f"user-{i}" for i in range(100)]) == {2: 200}


async def test_abort_sends_every_request_to_the_current_revision(rollout: Rollout) -> None:
    await rollout.start(50)
    await rollout.store.AbortRollout(store_pb.AbortRolloutRequest(name="alpha", reason="test"))
    await rollout.applied(None)
    assert await rollout.served_many([""] * 100 + [f"user-{i}" for i in range(100)]) == {1: 200}


async def _current_is(replica: RunningInference, revision: int) -> bool:
    return await replica.current("alpha") == revision


async def _under_load(rollout: Rollout, change: str) -> Counter[int]:
    """The revisions that served 400 requests sent while a rollout starts and is then
    promoted or aborted (`change`); any failed request fails the test."""
    load = asyncio.create_task(rollout.served_many([""] * 200 + [f"u{i}" for i in range(200)]))
    await rollout.start(50)
    if change == "promote":
        await rollout.store.PromoteRollout(store_pb.PromoteRolloutRequest(name="alpha"))
    else:
        await rollout.store.AbortRollout(store_pb.AbortRolloutRequest(name="alpha"))
    return await load


async def test_no_request_fails_while_a_rollout_starts_and_is_promoted_under_load(
    rollout: Rollout,
) -> None:
    served = await _under_load(rollout, "promote")
    assert sum(served.values()) == 400
    assert set(served) <= {1, 2}


async def test_no_request_fails_while_a_rollout_starts_and_is_aborted_under_load(
    rollout: Rollout,
) -> None:
    served = await _under_load(rollout, "abort")
    assert sum(served.values()) == 400
    assert set(served) <= {1, 2}
