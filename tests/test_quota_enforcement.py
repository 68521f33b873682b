"""Per-adapter quotas on real parts: moto over HTTP, the store's gRPC server, the inference
app (both fronts) on the session's vLLM engine. A quota set in the store is enforced by
the replica from its seq on: RESOURCE_EXHAUSTED with `retry-after` over gRPC, 429 with
Retry-After over HTTP, each refusal counted per adapter; a replica started after the
quota was set follows it from its listing. Requests are held in flight by the engine
wrapper, never by timing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.holding import HoldingEngine
from loraserve.testing.engine.session import chat_template
from loraserve.testing.inference.app import (
    PROMPT,
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.waiting import PROCESS_GUARD_S, eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

ADAPTERS = ("alpha", "beta", "gamma", "delta")


@dataclass
class Stack:
    store: RunningStore
    store_stub: Any
    inference: RunningInference
    http: httpx.AsyncClient


@pytest.fixture(scope="module")
async def serving_stack(
    s3_server: str,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stack]:
    """One store holding ADAPTERS and one replica, with its HTTP front, for the module."""
    bucket = S3Bucket(s3_server, "loraserve-test-quotas")
    bucket.client().create_bucket(Bucket=bucket.bucket)
    async with (
        running_store(bucket) as store,
        grpc.aio.insecure_channel(store.address) as channel,
    ):
        stub = store_grpc.AdapterStoreServiceStub(channel)
        for seed, name in enumerate(ADAPTERS, start=1):
            await push(stub, name, adapter_files(tiny_adapter(seed=seed)))
        async with (
            inference_app(
                vllm_engine,
                model_dir=tiny_model_dir,
                store_address=store.address,
                cache_dir=tmp_path_factory.mktemp("quota-cache"),
                replica_id="quota-replica",
                extra=("--openai-listen", "127.0.0.1:0"),
                engine_type=HoldingEngine,
            ) as inference,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{inference.app.openai_port}", timeout=PROCESS_GUARD_S
            ) as http,
        ):
            yield Stack(store, stub, inference, http)


async def set_quota(serving_stack: Stack, name: str, **limits: Any) -> None:
    """Sets the quota (none: clears it) and waits until the replica has applied its seq."""
    request = store_pb.SetQuotaRequest(adapter_name=name)
    if limits:
        request.quota.CopyFrom(store_pb.AdapterQuota(**limits))
    response = await serving_stack.store_stub.SetQuota(request)
    runtime = serving_stack.inference.app.runtime_ref.get()
    await eventually(lambda: runtime.store_seq() >= response.seq, f"seq {response.seq} applied")


async def grpc_code(
    serving_stack: Stack, adapter: str, request: pb.GenerateRequest | None = None
) -> tuple[grpc.StatusCode, str]:
    """The status of one generation (short, unless `request`), and its `retry-after`
    trailing metadata (or, for other refusals, the status's message)."""
    request = request if request is not None else greedy(adapter, 4)
    call = serving_stack.inference.stub.Generate(request, timeout=PROCESS_GUARD_S)
    try:
        async for _ in call:
            pass
    except grpc.aio.AioRpcError as exc:
        retry = dict(exc.trailing_metadata() or ()).get("retry-after", "")
        return exc.code(), str(retry or exc.details())
    return grpc.StatusCode.OK, ""


def sequences(adapter: str, n: int) -> pb.GenerateRequest:
    """A short generation of `n` choices."""
    request = greedy(adapter, 2)
    request.sampling.n = n
    request.sampling.temperature = 1.0
    return request


async def completion(serving_stack: Stack, adapter: str) -> httpx.Response:
    body = {"model": adapter, "prompt": [5, 17, 42], "max_tokens": 4, "temperature": 0.0}
    return await serving_stack.http.post("/v1/completions", json=body)


async def held_in_flight(
    serving_stack: Stack, adapter: str, lora_name: str, request: pb.GenerateRequest | None = None
) -> asyncio.Task[tuple[grpc.StatusCode, str]]:
    """One request of `adapter` (whose engine name is `lora_name`) kept in flight until
    `release(stack)`."""
    engine = serving_stack.inference.engine
    assert isinstance(engine, HoldingEngine)
    engine.hold(lora_name)
    held = asyncio.create_task(grpc_code(serving_stack, adapter, request))
    await engine.until_held(1, held)
    await eventually(
        lambda: serving_stack.inference.app.quotas.in_flight(adapter) >= 1,
        f"{adapter or 'the base model'}'s request in flight",
    )
    return held


def release(serving_stack: Stack) -> None:
    engine = serving_stack.inference.engine
    assert isinstance(engine, HoldingEngine)
    engine.let_go()


def throttled(serving_stack: Stack, adapter: str, limit: str) -> float:
    value = serving_stack.inference.app.metrics.registry.get_sample_value(
        "loraserve_inference_throttled_requests_total", {"adapter": adapter, "limit": limit}
    )
    return value or 0.0


async def test_an_adapter_at_its_in_flight_quota_is_refused_over_both_fronts(
    serving_stack: Stack,
) -> None:
    await set_quota(serving_stack, "alpha", max_in_flight=1)
    held = await held_in_flight(serving_stack, "alpha", "alpha@1")
    refused_grpc = await grpc_code(serving_stack, "alpha")
    refused_http = await completion(serving_stack, "alpha")
    other = await grpc_code(serving_stack, "beta")
    release(serving_stack)
    assert (await held)[0] == grpc.StatusCode.OK
    assert refused_grpc == (grpc.StatusCode.RESOURCE_EXHAUSTED, "1")
    assert refused_http.status_code == 429
    assert refused_http.headers["retry-after"] == "1"
    assert "alpha" in refused_http.json()["error"]["message"]
    assert other[0] == grpc.StatusCode.OK
    assert (await grpc_code(serving_stack, "alpha"))[0] == grpc.StatusCode.OK
    assert throttled(serving_stack, "alpha", "in_flight") == 2
    await set_quota(serving_stack, "alpha")


async def test_spent_tokens_per_minute_are_refused_with_the_seconds_to_wait(
    serving_stack: Stack,
) -> None:
    # One token a minute: the first request (4 tokens) spends it and more, so the next
    # ones wait minutes, however slow the machine.
    await set_quota(serving_stack, "gamma", tokens_per_minute=1)
    first = await grpc_code(serving_stack, "gamma")
    refused_grpc = await grpc_code(serving_stack, "gamma")
    refused_http = await completion(serving_stack, "gamma")
    assert first[0] == grpc.StatusCode.OK
    assert refused_grpc[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(refused_grpc[1]) > 60
    assert refused_http.status_code == 429
    assert int(refused_http.headers["retry-after"]) > 60
    assert "tokens per minute" in refused_http.json()["error"]["message"]
    assert throttled(serving_stack, "gamma", "tokens_per_minute") == 2
    await set_quota(serving_stack, "gamma")
    assert (await grpc_code(serving_stack, "gamma"))[0] == grpc.StatusCode.OK


async def test_the_default_quota_binds_adapters_without_their_own_until_cleared(
    serving_stack: Stack,
) -> None:
    await set_quota(serving_stack, "beta", tokens_per_second=1_000_000)
    await set_quota(serving_stack, "", tokens_per_minute=1)
    spent = [await grpc_code(serving_stack, "delta") for _ in range(2)]
    own = [await grpc_code(serving_stack, "beta") for _ in range(2)]
    await set_quota(serving_stack, "")
    lifted = await grpc_code(serving_stack, "delta")
    await set_quota(serving_stack, "beta")
    assert [code for code, _ in spent] == [grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert [code for code, _ in own] == [grpc.StatusCode.OK] * 2
    assert lifted[0] == grpc.StatusCode.OK


async def test_a_replica_started_after_a_quota_was_set_enforces_it_from_the_listing(
    serving_stack: Stack,
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    await set_quota(serving_stack, "delta", tokens_per_minute=1)
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=serving_stack.store.address,
        cache_dir=tmp_path / "cache",
        replica_id="quota-replica-2",
    ) as restarted:
        codes = []
        for _ in range(2):
            try:
                await restarted.generate("delta", 4, timeout=PROCESS_GUARD_S)
                codes.append(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.append(exc.code())
    await set_quota(serving_stack, "delta")
    assert codes == [grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED]


async def test_base_model_requests_are_not_counted_with_names_the_replica_does_not_route(
    serving_stack: Stack,
) -> None:
    await set_quota(serving_stack, "", max_in_flight=1)
    held = await held_in_flight(serving_stack, "", "")
    unknown = await grpc_code(serving_stack, "nosuch")
    release(serving_stack)
    await set_quota(serving_stack, "")
    assert (await held)[0] == grpc.StatusCode.OK
    assert unknown[0] == grpc.StatusCode.NOT_FOUND


async def test_a_request_of_more_sequences_than_max_in_flight_is_refused_naming_the_limit(
    serving_stack: Stack,
) -> None:
    await set_quota(serving_stack, "alpha", max_in_flight=1)
    code, message = await grpc_code(serving_stack, "alpha", sequences("alpha", 8))
    await set_quota(serving_stack, "alpha")
    # Retrying could never help: it is no throttle but a request this quota cannot take.
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "n=8" in message
    assert "max_in_flight" in message


async def test_in_flight_counts_a_requests_sequences_not_the_request(serving_stack: Stack) -> None:
    await set_quota(serving_stack, "beta", max_in_flight=4)
    held = await held_in_flight(serving_stack, "beta", "beta@1", sequences("beta", 3))
    try:
        # Checked before the next request: one admitted by mistake would be held too.
        assert serving_stack.inference.app.quotas.in_flight("beta") == 3
        refused = await grpc_code(serving_stack, "beta", sequences("beta", 2))
    finally:
        release(serving_stack)
        await set_quota(serving_stack, "beta")
    assert (await held)[0] == grpc.StatusCode.OK
    assert refused[0] == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_prompt_tokens_are_charged_so_long_prompts_with_one_token_spend_the_quota(
    serving_stack: Stack,
) -> None:
    # 100 tokens a minute and 320-token prompts: the first request overdraws the bucket
    # by minutes' worth, however slow the machine; generated tokens alone (1) would not.
    await set_quota(serving_stack, "gamma", tokens_per_minute=100)
    long_prompt = greedy("gamma", 1, prompt=PROMPT * 40)
    first = await grpc_code(serving_stack, "gamma", long_prompt)
    second = await grpc_code(serving_stack, "gamma", long_prompt)
    await set_quota(serving_stack, "gamma")
    assert first[0] == grpc.StatusCode.OK
    assert second[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert int(second[1]) > 60


async def test_a_chat_refused_by_its_quota_never_renders_the_chat_template(
    serving_stack: Stack, vllm_engine: AsyncLLM
) -> None:
    await set_quota(serving_stack, "delta", tokens_per_minute=1)
    spent = await grpc_code(serving_stack, "delta")
    body = {"model": "delta", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    # A template that fails whenever it is rendered: a 400 would say it was.
    with chat_template(vllm_engine, "{{ raise_exception('the template was rendered') }}"):
        refused = await serving_stack.http.post("/v1/chat/completions", json=body)
    await set_quota(serving_stack, "delta")
    assert spent[0] == grpc.StatusCode.OK
    assert refused.status_code == 429, refused.text
