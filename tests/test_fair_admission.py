"""Fair admission on the real engine: with the engine saturated (one request in it at a
time here, `--max-engine-requests 1`), a request of another adapter goes in before a
flood's backlog, not after it. Real parts: moto over HTTP, the store's gRPC server, the
inference app on the session's vLLM engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loraserve.inference.serving import FairGate
from loraserve.testing.inferenceapp import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.models import TinyAdapterFactory
from loraserve.testing.store import RunningStore
from loraserve.testing.storecalls import push, store_stub

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

# Guards against a hang only; nothing here measures time.
GUARD_S = 120


@pytest.fixture
async def saturated(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[RunningInference]:
    """A replica serving `flood` and `other` that lets one request into the engine."""
    async with store_stub(store_server.address) as stub:
        for seed, name in enumerate(("flood", "other"), start=1):
            await push(stub, name, adapter_files(tiny_adapter(seed=seed)))
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        replica_id="fair-replica",
        extra=("--max-engine-requests", "1"),
    ) as inference:
        yield inference


def _gate(inference: RunningInference) -> FairGate:
    gate = inference.app.runtime_ref.get().gate
    assert gate is not None, "fair admission is the default"
    return gate


async def _until_waiting(gate: FairGate, count: int) -> None:
    """Returns once `count` requests wait for their turn (the gate has no event for it)."""
    while True:
        if gate.waiting >= count:
            return
        await asyncio.sleep(0.01)


async def _first_token(inference: RunningInference, adapter: str, order: list[str]) -> None:
    """Streams one generation, noting `adapter` in `order` when its first token comes."""
    first = True
    async for message in inference.stub.Generate(greedy(adapter, 8), timeout=GUARD_S):
        if first and message.token_ids:
            order.append(adapter)
            first = False


async def test_another_adapters_request_goes_in_before_a_floods_backlog(
    saturated: RunningInference,
) -> None:
    gate = _gate(saturated)
    order: list[str] = []
    async with asyncio.timeout(GUARD_S):
        # The flood's first request holds the engine's one place; three more queue.
        blocker = saturated.stub.Generate(greedy("flood", 32), timeout=GUARD_S)
        await anext(aiter(blocker))
        flood = [asyncio.create_task(_first_token(saturated, "flood", order)) for _ in range(3)]
        await _until_waiting(gate, 3)
        other = asyncio.create_task(_first_token(saturated, "other", order))
        await _until_waiting(gate, 4)
        async for _ in blocker:
            pass
        await asyncio.gather(*flood, other)
    # First come first served would have run `other` after the whole backlog.
    assert order == ["flood", "other", "flood", "flood"]
    assert (gate.inside, gate.waiting) == (0, 0)
