"""Who may pin what (issue 54, item 5), on a real store over S3 (moto) and a real replica
on the session's vLLM engine: a rolled-back revision is not servable pinned under the
default pin policy (`rollout`), it is under `--pin-policy any`, and a yanked revision
is not servable pinned under any policy; where the replica authenticates, only a
pinner token may pin."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.common.rpc.security import ClientSecurity, secure_channel
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import (
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import PROCESS_GUARD_S, eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.faults, pytest.mark.engine]

REASON = "answers with the system prompt"
READER = "reader-secret"
PINNER = "pinner-secret"


@asynccontextmanager
async def _rolled_back(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store: RunningStore,
    tmp_path: Path,
    extra: Sequence[str] = (),
) -> AsyncIterator[RunningInference]:
    """alpha@2 pushed, then rolled back to alpha@1, and a replica (started with `extra`)
    routing alpha@1."""
    async with store_stub(store.address) as stub:
        for seed in (1, 2):
            await push(stub, "alpha", adapter_files(tiny_adapter(seed=seed)))
        await stub.SetCurrentRevision(store_pb.SetCurrentRevisionRequest(name="alpha", revision=1))
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store.address,
        cache_dir=tmp_path / "cache",
        extra=extra,
    ) as inference:
        await eventually(lambda: _routes(inference, 1), "alpha@1 routed", PROCESS_GUARD_S)
        yield inference


async def _routes(inference: RunningInference, revision: int) -> bool:
    return await inference.current("alpha") == revision


async def _refusal(inference: RunningInference, adapter: str) -> grpc.aio.AioRpcError | None:
    try:
        await inference.generate(adapter, 4)
    except grpc.aio.AioRpcError as e:
        return e
    return None


async def _refuses(inference: RunningInference, adapter: str) -> bool:
    return await _refusal(inference, adapter) is not None


async def test_a_rolled_back_revision_is_refused_pinned_under_the_default_policy(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> None:
    async with _rolled_back(
        vllm_engine, tiny_model_dir, tiny_adapter, store_server, tmp_path
    ) as inference:
        refused = await _refusal(inference, "alpha@2")
        served, _ = await inference.generate("alpha@1", 4)

    assert refused is not None
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "alpha@2" in (refused.details() or "")
    assert "pin policy 'rollout'" in (refused.details() or "")
    assert served == 1
    assert "alpha@2" not in inference.add_calls


async def test_pin_policy_any_serves_a_rolled_back_revision_pinned(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> None:
    async with _rolled_back(
        vllm_engine, tiny_model_dir, tiny_adapter, store_server, tmp_path, ("--pin-policy", "any")
    ) as inference:
        served, _ = await inference.generate("alpha@2", 4)

    assert served == 2


async def test_a_yanked_revision_is_refused_pinned_once_the_replica_has_the_yank(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> None:
    async with _rolled_back(
        vllm_engine, tiny_model_dir, tiny_adapter, store_server, tmp_path, ("--pin-policy", "any")
    ) as inference:
        await inference.generate("alpha@2", 4)
        async with store_stub(store_server.address) as stub:
            await stub.YankRevision(
                store_pb.YankRevisionRequest(name="alpha", revision=2, reason=REASON)
            )
        await eventually(lambda: _refuses(inference, "alpha@2"), "alpha@2 refused", PROCESS_GUARD_S)
        refused = await _refusal(inference, "alpha@2")

    assert refused is not None
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.details() == f"alpha@2 is yanked: {REASON}"


async def _pin_code(address: str, token: str, adapter: str) -> grpc.StatusCode:
    channel = secure_channel(address, ClientSecurity(token=token))
    async with channel:
        try:
            async for _ in pb_grpc.InferenceServiceStub(channel).Generate(
                greedy(adapter, 2), timeout=PROCESS_GUARD_S
            ):
                pass
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


async def test_only_a_pinner_token_may_pin_where_the_replica_authenticates(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> None:
    tokens = ("--reader-token", f"app:{READER}", "--pinner-token", f"ops:{PINNER}")
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        extra=tokens,
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
    ) as inference:
        codes = [
            await _pin_code(inference.address, token, adapter)
            for token, adapter in ((READER, "alpha@1"), (PINNER, "alpha@1"), (READER, "alpha"))
        ]

    assert codes == [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.OK, grpc.StatusCode.OK]
