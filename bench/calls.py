"""The ways a benchmark calls the engine: over gRPC with the client library, through
the service's Generator in-process, vLLM (VllmEngine) directly in-process, and the
competitors' protocols: OpenAI `/v1/completions` streaming (vllm serve and loraserve's
front) and vLLM's own gRPC Generate."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import grpc

from bench.raw_engine import greedy_params
from bench.workload import Caller
from loraserve.clients.inference import InferenceClient, RetryPolicy, Sampling
from loraserve.common.names import parse_adapter_ref
from loraserve.inference.adapters import AdapterRegistry
from loraserve.inference.engine import AdapterHandle, SamplingSpec, VllmEngine
from loraserve.inference.serving.generation import GenerateCommand, Generator, SamplingRequest


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


def generator_caller(generator: Generator) -> Caller:
    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        command = GenerateCommand(
            adapter=adapter,
            prompt_token_ids=tuple(prompt),
            sampling=SamplingRequest(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
        )
        async for chunk in generator.generate(command):
            yield len(chunk.token_ids), chunk.revision

    return call


async def resolve_handles(
    registry: AdapterRegistry, adapters: Sequence[str]
) -> dict[str, AdapterHandle | None]:
    """The engine handle each adapter name routes to now (None: the base model)."""
    handles: dict[str, AdapterHandle | None] = {}
    for name in set(adapters):
        async with registry.acquire(parse_adapter_ref(name)) as lease:
            handles[name] = lease.adapter
    return handles


def direct_caller(engine: VllmEngine, handles: dict[str, AdapterHandle | None]) -> Caller:
    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        # vLLM's own params, built here: the baseline pays nothing of loraserve's mapping.
        spec = SamplingSpec(max_tokens=max_tokens, n=1, params=greedy_params(max_tokens))
        async for delta in engine.generate(uuid.uuid4().hex, prompt, spec, handles[adapter]):
            yield len(delta.token_ids), 0

    return call


def openai_caller(http: aiohttp.ClientSession, base_url: str, base_model: str) -> Caller:
    """Streams `/v1/completions` (greedy, ignore_eos, token-id prompt, `return_token_ids`)
    from `vllm serve` or loraserve's OpenAI front: the same request for both. Tokens are
    counted by the ids each event carries (an event may carry none, or several); an
    error sent inside the stream fails the request."""
    url = base_url + "/v1/completions"

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        body = {
            "model": adapter or base_model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        async with http.post(url, json=body) as response:
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
