"""The ways a benchmark calls the engine: over gRPC with the client library, through
the service's Generator in-process, or vLLM (VllmEngine) directly in-process."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

from bench.workload import Caller
from loraserve.clients.inference import InferenceClient, RetryPolicy, Sampling
from loraserve.common.names import parse_adapter_ref
from loraserve.inference.engine import AdapterHandle, SamplingSpec, VllmEngine
from loraserve.inference.generation import GenerateCommand, Generator, SamplingRequest
from loraserve.inference.registry import AdapterRegistry


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
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        # vLLM's own params, built here: the baseline pays nothing of loraserve's mapping.
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            output_kind=RequestOutputKind.DELTA,
        )
        spec = SamplingSpec(max_tokens=max_tokens, n=1, params=params)
        async for delta in engine.generate(uuid.uuid4().hex, prompt, spec, handles[adapter]):
            yield len(delta.token_ids), 0

    return call
