"""The ways a load generator calls a server: over gRPC with the client library or the
raw generated stub, OpenAI `/v1/completions` streaming with aiohttp or the `openai` SDK
(vllm serve and loraserve's front), and vLLM's own gRPC Generate. (Callers that run
inside a server process are bench.rig.engine_callers'.)"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc

from bench.load.workload import Caller
from loraserve.clients.inference import InferenceClient, RetryPolicy, Sampling
from loraserve.clients.routing import ADAPTER_HASH_HEADER, affinity_key
from loraserve.common.config.sizes import MESSAGE_LIMIT_OPTIONS
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc


def grpc_caller(client: InferenceClient) -> Caller:
    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        sampling = Sampling(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        async for delta in client.stream(adapter, list(prompt), sampling):
            yield len(delta.token_ids), delta.revision

    return call


def no_retry_client(address: str) -> InferenceClient:
    """A client that reports the first failure instead of hiding it behind retries."""
    return InferenceClient(address, retry=RetryPolicy(max_attempts=1))


def routed_caller(callers: dict[str, Caller]) -> Caller:
    """Each adapter's requests to its own server (two tenants on two engines)."""

    def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        return callers[adapter](adapter, prompt, max_tokens)

    return call


def grpc_stub_caller(
    channel: grpc.aio.Channel, *, affinity: bool = False, timeout: float | None = None
) -> Caller:
    """Generate through the raw generated stub, no client library: what the server
    costs per streamed message, with the least client work on top. With `affinity`,
    each call carries the adapter's ring_hash header, as the client library sends it."""
    stub = pb_grpc.InferenceServiceStub(channel)

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        request = pb.GenerateRequest(
            adapter=adapter,
            token_ids=pb.TokenIds(ids=list(prompt)),
            sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )
        metadata = ((ADAPTER_HASH_HEADER, affinity_key(adapter)),) if affinity else None
        stream = stub.Generate(request, metadata=metadata, timeout=timeout)
        try:
            async for message in stream:
                yield len(message.token_ids), message.revision
        finally:
            stream.cancel()

    return call


def stub_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=MESSAGE_LIMIT_OPTIONS)


@dataclass
class Reconnects:
    """Requests sent again because the server closed a pooled keep-alive connection
    just before its reuse (uvicorn's 5 s keep-alive; both HTTP servers do it)."""

    count: int = 0


def _completion_body(
    adapter: str, base_model: str, prompt: Sequence[int], max_tokens: int
) -> dict[str, Any]:
    return {
        "model": adapter or base_model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }


def openai_caller(
    http: aiohttp.ClientSession,
    base_url: str,
    base_model: str,
    reconnects: Reconnects | None = None,
) -> Caller:
    """Streams `/v1/completions` (greedy, ignore_eos, token-id prompt, `return_token_ids`)
    from `vllm serve` or loraserve's OpenAI front: the same request for both. Tokens are
    counted by the ids each event carries (an event may carry none, or several); an
    error sent inside the stream fails the request. A connection the server closed
    before answering is retried once and counted in `reconnects`."""
    url = base_url + "/v1/completions"
    counted = reconnects or Reconnects()

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        body = _completion_body(adapter, base_model, prompt, max_tokens)
        try:
            response = await http.post(url, json=body)
        except aiohttp.ServerDisconnectedError:
            counted.count += 1
            response = await http.post(url, json=body)
        async with response:
            if response.status != 200:
                detail = (await response.read()).decode(errors="replace")[:300]
                raise RuntimeError(f"HTTP {response.status}: {detail}")
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                event = json.loads(line[len(b"data: ") :])
                if "error" in event:
                    raise RuntimeError(f"stream error: {event['error']}")
                tokens = sum(len(c.get("token_ids") or ()) for c in event.get("choices", ()))
                if tokens:
                    yield tokens, 0

    return call


def openai_sdk_caller(client: Any, base_model: str) -> Caller:
    """Streams completions with `openai.AsyncOpenAI`, as an application would: the
    client CPU per token of the OpenAI SDK (issue 28's comparison)."""

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        stream = await client.completions.create(
            model=adapter or base_model,
            prompt=list(prompt),
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        async with stream:
            async for chunk in stream:
                tokens = 0
                for choice in chunk.choices:
                    ids = (choice.model_extra or {}).get("token_ids")
                    tokens += len(ids) if ids is not None else int(bool(choice.text))
                if tokens:
                    yield tokens, 0

    return call


def http_session() -> aiohttp.ClientSession:
    """No connection limit (one per concurrent stream) and no timeout: a slow server is
    measured, not cut. aiohttp, the quicker of the Python clients, so that the client's
    share of these 2 cores weighs as little as it can on the HTTP arms."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )


def vllm_grpc_caller(channel: grpc.aio.Channel) -> Caller:
    """Streams vLLM's own gRPC Generate (smg-grpc-servicer's contract, imported here: the
    arm reports it missing instead of the benchmark failing); it has no LoRA field, so
    the base model only."""
    from smg_grpc_proto import (  # type: ignore[import-untyped]
        vllm_engine_pb2,
        vllm_engine_pb2_grpc,
    )

    stub: Any = vllm_engine_pb2_grpc.VllmEngineStub(channel)

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        if adapter:
            raise ValueError("vLLM's gRPC Generate has no LoRA field: base model only")
        request = vllm_engine_pb2.GenerateRequest(
            request_id=uuid.uuid4().hex,
            tokenized=vllm_engine_pb2.TokenizedInput(input_ids=list(prompt)),
            sampling_params=vllm_engine_pb2.SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True, n=1
            ),
            stream=True,
        )
        async for response in stub.Generate(request):
            if response.HasField("chunk") and response.chunk.token_ids:
                yield len(response.chunk.token_ids), 0

    return call
