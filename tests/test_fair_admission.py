"""Fair admission on the real engine: with the engine saturated (one request in it at a
time here, `--max-engine-requests 1`), a request of another adapter goes in before a
flood's backlog, not after it. Real parts: moto over HTTP, the store's gRPC server, the
inference app on the session's vLLM engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from loraserve.inference.serving import FairGate, SlotGate
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.holding import HoldingEngine
from loraserve.testing.engine.session import MAX_LORAS
from loraserve.testing.inference.app import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import PROCESS_GUARD_S, eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine


# Adapters that fill the engine's LoRA slots (and `cold`, one more).
RESIDENTS = tuple(f"slot{i}" for i in range(MAX_LORAS))


@pytest.fixture
def replica(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> Callable[..., AbstractAsyncContextManager[RunningInference]]:
    """Starts a replica holding requests on demand (HoldingEngine), serving `adapters`,
    with `extra` flags."""

    def start(
        adapters: Sequence[str], *extra: str
    ) -> AbstractAsyncContextManager[RunningInference]:
        return inference_app(
            vllm_engine,
            model_dir=tiny_model_dir,
            store_address=store_server.address,
            cache_dir=tmp_path / "cache",
            replica_id="fair-replica",
            extra=extra,
            engine_type=HoldingEngine,
            pushed={
                name: adapter_files(tiny_adapter(seed=seed))
                for seed, name in enumerate(adapters, start=1)
            },
        )

    return start


@pytest.fixture
async def saturated(replica: Callable[..., Any]) -> AsyncIterator[RunningInference]:
    """A replica serving `flood` and `other` that lets one request into the engine."""
    async with replica(("flood", "other"), "--max-engine-requests", "1") as inference:
        yield inference


@pytest.fixture
async def two_places(replica: Callable[..., Any]) -> AsyncIterator[RunningInference]:
    """A replica serving `wide` and `other` that lets two sequences into the engine."""
    async with replica(("wide", "other"), "--max-engine-requests", "2") as inference:
        yield inference


@pytest.fixture
async def slots_filled(replica: Callable[..., Any]) -> AsyncIterator[RunningInference]:
    """A replica serving as many adapters as the engine has LoRA slots, and `cold`,
    taking the slots in turns."""
    async with replica((*RESIDENTS, "cold"), "--lora-slot-order", "turns") as inference:
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
    async for message in inference.stub.Generate(greedy(adapter, 8), timeout=PROCESS_GUARD_S):
        if first and message.token_ids:
            order.append(adapter)
            first = False


async def _queued_behind_a_flood(
    inference: RunningInference, queue: list[Coroutine[Any, Any, None]]
) -> None:
    """The flood's first request holds the engine's one place while each of `queue`
    comes to wait in order; then it ends, and they all run."""
    gate = _gate(inference)
    engine = inference.engine
    assert isinstance(engine, HoldingEngine)
    # Held, its turn stays taken however fast the engine would run it.
    engine.hold("flood@1")
    async with asyncio.timeout(PROCESS_GUARD_S):
        blocker = asyncio.create_task(_first_token(inference, "flood", []))
        await engine.until_held(1, blocker)
        tasks = []
        for count, request in enumerate(queue, start=1):
            tasks.append(asyncio.create_task(request))
            await _until_waiting(gate, count)
        engine.let_go()
        await asyncio.gather(blocker, *tasks)
    assert (gate.inside, gate.waiting) == (0, 0)


async def test_another_adapters_request_goes_in_before_a_floods_backlog(
    saturated: RunningInference,
) -> None:
    order: list[str] = []
    flood = [_first_token(saturated, "flood", order) for _ in range(3)]
    await _queued_behind_a_flood(saturated, [*flood, _first_token(saturated, "other", order)])
    # First come first served would have run `other` after the whole backlog.
    assert order == ["flood", "other", "flood", "flood"]


async def _refused(inference: RunningInference, adapter: str, order: list[str]) -> None:
    """Sends one generation for a name no adapter has, noting "made-up" in `order` when
    it is refused."""
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in inference.stub.Generate(greedy(adapter, 8), timeout=PROCESS_GUARD_S):
            pass
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    order.append("made-up")


async def test_names_no_adapter_has_take_turns_as_one_adapter(
    saturated: RunningInference,
) -> None:
    order: list[str] = []
    made_up = [_refused(saturated, f"made-up-{i}", order) for i in range(3)]
    queue = [_first_token(saturated, "flood", order), *made_up]
    await _queued_behind_a_flood(saturated, [*queue, _first_token(saturated, "other", order)])
    # Each made-up name its own adapter would put all three before `other`.
    assert order == ["flood", "made-up", "other", "made-up", "made-up"]


async def _generate(inference: RunningInference, request: pb.GenerateRequest) -> None:
    async for _ in inference.stub.Generate(request, timeout=PROCESS_GUARD_S):
        pass


async def test_a_request_of_n_sequences_takes_n_places_in_the_engine(
    two_places: RunningInference,
) -> None:
    gate = _gate(two_places)
    engine = two_places.engine
    assert isinstance(engine, HoldingEngine)
    wide_request = greedy("wide", 4)
    wide_request.sampling.n = 2
    wide_request.sampling.temperature = 1.0
    engine.hold("wide@1")
    async with asyncio.timeout(PROCESS_GUARD_S):
        wide = asyncio.create_task(_generate(two_places, wide_request))
        await engine.until_held(1, wide)
        other = asyncio.create_task(_generate(two_places, greedy("other", 4)))
        await eventually(lambda: gate.waiting > 0 or other.done(), "other waits or ends")
        # Counted as one request, the wide one would leave `other` a place.
        waited = (gate.inside, gate.waiting, other.done())
        engine.let_go()
        await asyncio.gather(wide, other)
    assert waited == (2, 1, False)


@asynccontextmanager
async def _every_slot_held(inference: RunningInference) -> AsyncIterator[SlotGate]:
    """One request of each resident adapter held in the engine, each in its LoRA slot,
    until the block exits (those not let go by then are let go and awaited)."""
    slots = inference.app.runtime_ref.get().slots
    assert slots is not None, "--lora-slot-order turns"
    engine = inference.engine
    assert isinstance(engine, HoldingEngine)
    engine.hold_each(*(f"{name}@1" for name in RESIDENTS))
    async with asyncio.timeout(PROCESS_GUARD_S):
        held = [asyncio.create_task(_first_token(inference, name, [])) for name in RESIDENTS]
        await engine.until_held(MAX_LORAS, *held)
        yield slots
        engine.let_go_of_each()
        await asyncio.gather(*held)


async def test_an_adapter_waiting_for_a_lora_slot_goes_in_before_the_drained_adapters_next(
    slots_filled: RunningInference,
) -> None:
    engine = slots_filled.engine
    assert isinstance(engine, HoldingEngine)
    order: list[str] = []
    async with _every_slot_held(slots_filled) as slots:
        cold = asyncio.create_task(_first_token(slots_filled, "cold", order))
        await eventually(lambda: slots.waiting == 1, "cold waits for a slot")
        # Each holds one request: the one resident longest is drained for `cold`.
        drained = slots.resident[0]
        again = asyncio.create_task(_first_token(slots_filled, drained, order))
        await eventually(lambda: slots.waiting == 2, "the drained adapter's request waits")
        engine.let_go_of(f"{drained}@1")
        await asyncio.gather(cold, again)
    # vLLM's own order lets a resident adapter's requests in while any of its run.
    assert order == ["cold", drained]
    assert (slots.resident, slots.waiting) == ((), 0)


async def test_a_name_no_adapter_has_is_refused_at_once_while_every_lora_slot_is_held(
    slots_filled: RunningInference,
) -> None:
    async with _every_slot_held(slots_filled) as slots:
        # Given a slot, it would wait for a resident adapter drained for it, held here.
        await _refused(slots_filled, "made-up", [])
        assert slots.waiting == 0
