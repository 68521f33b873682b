"""Hot-swap end to end: a real store over moto S3, the sync loop, the real vLLM engine
and the inference gRPC server, checked against the transformers + PEFT oracle."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.inference.engine import VllmEngine
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.engine.holding import HoldingEngine
from loraserve.testing.inference.app import RunningInference, inference_app
from loraserve.testing.processes.tcpproxy import TcpProxy, tcp_proxy
from loraserve.testing.store.server import RunningStore
from loraserve.testing.streams import messages
from loraserve.testing.waiting import eventually
from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.engine, pytest.mark.slow]

log = logging.getLogger(__name__)

REPLICA = "replica-under-test"
PROMPT = (5, 17, 42, 99, 3, 250, 7, 64)
SHORT = 12


@cache
def oracle(model_dir: Path, adapter_dir: Path, max_new_tokens: int) -> tuple[int, ...]:
    return tuple(greedy_tokens(model_dir, adapter_dir, PROMPT, max_new_tokens))


@dataclass
class Stack:
    store: RunningStore
    store_stub: Any
    running: RunningInference
    cache_dir: Path
    model_dir: Path
    adapter: TinyAdapterFactory

    @property
    def inference(self) -> Any:
        return self.running.stub

    @property
    def engine(self) -> HoldingEngine:
        assert isinstance(self.running.engine, HoldingEngine)
        return self.running.engine

    async def push(self, name: str, adapter_dir: Path, *, no_promote: bool = False) -> int:
        files = await asyncio.to_thread(_adapter_files, adapter_dir)
        response = await self.store_stub.PushAdapter(
            push_requests(name, files, no_promote=no_promote)
        )
        revision: int = response.revision.revision
        return revision

    async def generate(self, adapter: str, max_tokens: int = SHORT) -> tuple[int, tuple[int, ...]]:
        """The revision served and the token ids of a greedy generation."""
        revision = 0
        tokens: list[int] = []
        async for message in self.inference.Generate(_request(adapter, max_tokens)):
            revision = revision or message.revision
            tokens.extend(message.token_ids)
        return revision, tuple(tokens)

    async def served(self, name: str, revision: int) -> None:
        async def routed_in_engine() -> bool:
            status = (await self.revisions(name)).get(revision)
            return status is not None and status.current and status.state == pb.ADAPTER_STATE_READY

        await eventually(routed_in_engine, f"{name}@{revision} routed")

    async def revisions(self, name: str) -> dict[int, pb.AdapterRevisionStatus]:
        """What the inference server's ListAdapters says about `name`, by revision."""
        response = await self.inference.ListAdapters(pb.ListAdaptersRequest())
        return {s.revision: s for s in response.adapters if s.name == name}


def _adapter_files(adapter_dir: Path) -> dict[str, bytes]:
    names = ("adapter_config.json", "adapter_model.safetensors")
    return {name: (adapter_dir / name).read_bytes() for name in names}


def _request(adapter: str, max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        adapter=adapter,
        token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


@asynccontextmanager
async def inference_stack(
    store: RunningStore,
    llm: AsyncLLM,
    model_dir: Path,
    cache_dir: Path,
    adapter: TinyAdapterFactory,
    store_address: str | None = None,
) -> AsyncIterator[Stack]:
    """The inference app, as its own wiring builds it, following `store`."""
    async with (
        inference_app(
            llm,
            model_dir=model_dir,
            store_address=store_address or store.address,
            cache_dir=cache_dir,
            replica_id=REPLICA,
            engine_type=HoldingEngine,
            # The pinned tests pin revisions that are no longer current.
            extra=("--pin-policy", "any"),
        ) as running,
        grpc.aio.insecure_channel(store.address) as store_channel,
    ):
        yield Stack(
            store=store,
            store_stub=store_grpc.AdapterStoreServiceStub(store_channel),
            running=running,
            cache_dir=cache_dir,
            model_dir=model_dir,
            adapter=adapter,
        )


@pytest.fixture
async def serving_stack(
    store_server: RunningStore,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
) -> AsyncIterator[Stack]:
    async with inference_stack(
        store_server, vllm_engine, tiny_model_dir, tmp_path / "cache", tiny_adapter
    ) as running:
        yield running


async def test_push_while_streaming_finishes_old_stream_on_old_revision_and_retires_it(
    serving_stack: Stack,
) -> None:
    rev1_dir, rev2_dir = (
        serving_stack.adapter(rank=8, seed=1),
        serving_stack.adapter(rank=8, seed=2),
    )
    long_tokens = 400
    expected_long = oracle(serving_stack.model_dir, rev1_dir, long_tokens)
    expected_new = oracle(serving_stack.model_dir, rev2_dir, SHORT)
    assert expected_long[:SHORT] != expected_new, "the two revisions must differ"
    await serving_stack.push("swap", rev1_dir)
    await serving_stack.served("swap", 1)
    rev1_lora_id = (await serving_stack.revisions("swap"))[1].lora_int_id

    engine = serving_stack.engine
    engine.hold("swap@1")
    draining = asyncio.create_task(
        messages(serving_stack.inference.Generate(_request("swap", long_tokens)))
    )
    await engine.until_held(1, draining)
    await serving_stack.push("swap", rev2_dir)
    await serving_stack.served("swap", 2)
    engine.let_go()
    new_requests = await asyncio.gather(*(serving_stack.generate("swap") for _ in range(3)))
    long_stream = await draining

    assert long_stream[0].revision == 1
    assert tuple(t for message in long_stream for t in message.token_ids) == expected_long
    assert new_requests == [(2, expected_new)] * 3
    await eventually(
        lambda: _lora_gone(serving_stack.engine, rev1_lora_id), "revision 1 removed from the engine"
    )
    await eventually(
        lambda: not (serving_stack.cache_dir / "swap" / "1").exists(), "rev 1 files deleted"
    )
    assert (serving_stack.cache_dir / "swap" / "2").is_dir()


async def _lora_gone(engine: VllmEngine, lora_int_id: int) -> bool:
    return lora_int_id not in await engine.list_loras()


async def test_rollback_routes_the_name_back_to_the_older_revision(serving_stack: Stack) -> None:
    rev1_dir, rev2_dir = serving_stack.adapter(seed=11), serving_stack.adapter(seed=12)
    await serving_stack.push("roll", rev1_dir)
    await serving_stack.push("roll", rev2_dir)
    await serving_stack.served("roll", 2)
    await serving_stack.store_stub.SetCurrentRevision(
        store_pb.SetCurrentRevisionRequest(name="roll", revision=1)
    )
    await serving_stack.served("roll", 1)
    assert await serving_stack.generate("roll") == (
        1,
        oracle(serving_stack.model_dir, rev1_dir, SHORT),
    )


async def test_pinned_revision_is_served_beside_the_current_one(serving_stack: Stack) -> None:
    rev1_dir, rev2_dir = serving_stack.adapter(seed=21), serving_stack.adapter(seed=22)
    await serving_stack.push("pin", rev1_dir)
    await serving_stack.push("pin", rev2_dir)
    await serving_stack.served("pin", 2)
    pinned, current = await asyncio.gather(
        serving_stack.generate("pin@1"), serving_stack.generate("pin")
    )
    assert pinned == (1, oracle(serving_stack.model_dir, rev1_dir, SHORT))
    assert current == (2, oracle(serving_stack.model_dir, rev2_dir, SHORT))


async def test_delete_stops_serving_the_name_and_its_status_with_it(serving_stack: Stack) -> None:
    await serving_stack.push("gone", serving_stack.adapter(seed=31))
    await serving_stack.served("gone", 1)
    await serving_stack.store_stub.DeleteAdapter(store_pb.DeleteAdapterRequest(name="gone"))
    await eventually(lambda: _unrouted(serving_stack, "gone"), "gone unrouted")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await serving_stack.generate("gone")
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await serving_stack.generate("gone@1")
    assert err.value.code() is grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await _replica_status(serving_stack, "gone")
    assert err.value.code() is grpc.StatusCode.NOT_FOUND


async def test_rank_above_the_engine_limit_is_nacked_and_the_old_revision_keeps_serving(
    serving_stack: Stack,
) -> None:
    good_dir = serving_stack.adapter(rank=8, seed=41)
    await serving_stack.push("big", good_dir)
    await serving_stack.served("big", 1)
    too_big = serving_stack.engine.info.max_lora_rank * 2
    await serving_stack.push("big", serving_stack.adapter(rank=too_big, seed=42))

    async def nacked() -> bool:
        status = await _replica_status(serving_stack, "big")
        return status is not None and status.type == store_pb.REPORT_TYPE_NACK

    await eventually(nacked, "NACK of big@2 reported")
    status = await _replica_status(serving_stack, "big")
    assert status is not None
    assert (status.reported_revision, status.serving_revision) == (2, 1)
    assert status.last_error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert f"rank {too_big}" in status.last_error.message
    assert await serving_stack.generate("big") == (
        1,
        oracle(serving_stack.model_dir, good_dir, SHORT),
    )


async def _unrouted(serving_stack: Stack, name: str) -> bool:
    return await serving_stack.running.current(name) == 0


async def _replica_status(serving_stack: Stack, name: str) -> Any:
    response = await serving_stack.store_stub.GetAdapterStatus(
        store_pb.GetAdapterStatusRequest(name=name)
    )
    return next((s for s in response.statuses if s.replica_id == REPLICA), None)


@pytest.fixture
async def proxied_stack(
    store_server: RunningStore,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path: Path,
) -> AsyncIterator[tuple[Stack, TcpProxy]]:
    async with (
        tcp_proxy(store_server.port) as proxy,
        inference_stack(
            store_server,
            vllm_engine,
            tiny_model_dir,
            tmp_path / "cache",
            tiny_adapter,
            store_address=proxy.address,
        ) as running,
    ):
        yield running, proxy


@pytest.mark.faults
async def test_cut_watch_reconnects_serves_the_latest_and_applies_each_revision_once(
    proxied_stack: tuple[Stack, TcpProxy],
) -> None:
    stack, proxy = proxied_stack
    await stack.push("flaky", stack.adapter(seed=51))
    await stack.served("flaky", 1)
    proxy.cut()
    await stack.push("flaky", stack.adapter(seed=52))
    latest_dir = stack.adapter(seed=53)
    await stack.push("flaky", latest_dir)
    proxy.restore()
    await stack.served("flaky", 3)
    assert proxy.connections >= 2
    applied = [name for name in stack.running.add_calls if name.startswith("flaky@")]
    assert len(applied) == len(set(applied)), applied
    assert applied[0] == "flaky@1"
    assert applied[-1] == "flaky@3"
    assert await stack.generate("flaky") == (3, oracle(stack.model_dir, latest_dir, SHORT))
