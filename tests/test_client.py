"""The client library against a real inference server on the real engine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.clients.channels import Retry, open_channel
from loraserve.clients.inference import (
    InferenceClient,
    RetryPolicy,
    Sampling,
    SyncInferenceClient,
)
from loraserve.common.errors import DeadlineExceeded, InvalidArgument, NotFound, Unavailable
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.work import engine_work
from loraserve.testing.inference.service import wait_until_idle
from loraserve.testing.processes.tcpproxy import tcp_proxy
from loraserve.tiny.oracle import greedy_tokens

pytestmark = pytest.mark.engine

PROMPT = [1, 40, 41, 42, 43, 44, 45]
GREEDY = Sampling(max_tokens=12, temperature=0.0, ignore_eos=True)
FAST_RETRY = RetryPolicy(max_attempts=20, initial_backoff=0.05, max_backoff=0.2)


async def test_stream_yields_the_adapters_oracle_tokens_and_names_the_revision(
    served_factory: Callable[..., Any], tiny_model_dir: Path, tiny_adapter: TinyAdapterFactory
) -> None:
    adapter = tiny_adapter(rank=8, seed=31)
    async for served in served_factory():
        await served.install("client-a", 3, adapter)
        async with InferenceClient(served.address) as client:
            deltas = [d async for d in client.stream("client-a", PROMPT, GREEDY)]
    tokens = [t for d in deltas for t in d.token_ids]
    assert (deltas[0].adapter_name, deltas[0].revision) == ("client-a", 3)
    assert tokens == greedy_tokens(tiny_model_dir, adapter, PROMPT, 12)
    assert deltas[-1].finish_reason == "length"


async def test_generate_returns_the_whole_completion_with_usage(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory():
        async with InferenceClient(served.address) as client:
            completion = await client.generate("", PROMPT, GREEDY)
    assert len(completion.token_ids) == 12
    assert completion.text
    assert (completion.prompt_tokens, completion.completion_tokens) == (len(PROMPT), 12)
    assert completion.finish_reason == "length"


async def test_unknown_adapter_raises_not_found(served_factory: Callable[..., Any]) -> None:
    async for served in served_factory():
        async with InferenceClient(served.address) as client:
            with pytest.raises(NotFound):
                await client.generate("no-such-adapter", PROMPT, GREEDY)


async def test_bad_sampling_raises_invalid_argument(served_factory: Callable[..., Any]) -> None:
    async for served in served_factory():
        async with InferenceClient(served.address) as client:
            with pytest.raises(InvalidArgument):
                await client.generate("", PROMPT, Sampling(temperature=-1.0))


async def test_unavailable_is_retried_until_the_server_is_ready(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory():
        runtime = served.runtime_ref.get()
        served.runtime_ref.set(None)
        async with InferenceClient(served.address, retry=FAST_RETRY) as client:
            pending = asyncio.create_task(client.generate("", PROMPT, GREEDY))
            await asyncio.sleep(0.3)
            assert not pending.done()
            served.runtime_ref.set(runtime)
            completion = await pending
    assert len(completion.token_ids) == 12


async def test_unavailable_past_the_retry_budget_raises_unavailable(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory():
        served.runtime_ref.set(None)
        policy = RetryPolicy(max_attempts=3, initial_backoff=0.01, max_backoff=0.02)
        async with InferenceClient(served.address, retry=policy) as client:
            with pytest.raises(Unavailable):
                await client.generate("", PROMPT, GREEDY)


async def test_a_stream_cut_after_its_headers_before_its_first_message_is_sent_again(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory():
        async with tcp_proxy(int(served.address.rsplit(":", 1)[1])) as proxy:
            proxy.cut_at_first_message()
            async with InferenceClient(proxy.address, retry=FAST_RETRY) as client:
                completion = await client.generate("", PROMPT, GREEDY)
            assert proxy.cut_at_message == 1
    assert len(completion.token_ids) == 12


async def test_grpcs_own_retry_policy_does_not_resend_a_stream_cut_after_its_headers(
    served_factory: Callable[..., Any],
) -> None:
    # Why the client retries Generate itself (docs/clients.md): gRPC commits a call
    # once its response headers arrive.
    service = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
    retry = Retry(max_attempts=5, initial_backoff_s=0.05, max_backoff_s=0.2)
    request = pb.GenerateRequest(
        token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
    )
    async for served in served_factory():
        async with tcp_proxy(int(served.address.rsplit(":", 1)[1])) as proxy:
            proxy.cut_at_first_message()
            channel = open_channel(
                proxy.address, ClientSecurity(), method_configs=[retry.method_config(service)]
            )
            async with channel:
                stub = pb_grpc.InferenceServiceStub(channel)
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    async for _ in stub.Generate(request, timeout=30):
                        pass
            assert proxy.cut_at_message == 1
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_deadline_ends_the_stream_and_aborts_the_engine_request(
    served_factory: Callable[..., Any],
) -> None:
    long = Sampling(max_tokens=400, temperature=0.0, ignore_eos=True)
    async for served in served_factory():
        before = engine_work()
        async with InferenceClient(served.address) as client:
            with pytest.raises(DeadlineExceeded):
                await client.generate("", PROMPT, long, timeout=0.5)
        assert await wait_until_idle(served.engine) == 0
        work = engine_work() - before
        # Aborted: neither run to its end nor its 400 tokens made (vLLM's own count).
        assert work.finished_requests == 0
        assert work.generated_tokens < 400


async def test_sync_client_streams_the_same_tokens_from_a_plain_thread(
    served_factory: Callable[..., Any],
) -> None:
    async for served in served_factory():
        async with InferenceClient(served.address) as client:
            expected = (await client.generate("", PROMPT, GREEDY)).token_ids
        # The blocking client runs in a thread with no event loop, as in a WSGI app.
        tokens = await asyncio.to_thread(_sync_tokens, served.address)
    assert tokens == expected


def _sync_tokens(address: str) -> list[int]:
    with SyncInferenceClient(address) as client:
        return [t for d in client.stream("", PROMPT, GREEDY) for t in d.token_ids]
