"""Callers that run inside a server process (bench.rig.engine_host): the service's
Generator, and vLLM through loraserve's VllmEngine with nothing of the service in
between. bench.load.thin serves them to a load generator in another process."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence

from bench.load.workload import Caller
from bench.rig.raw_engine import greedy_params
from loraserve.common.revisions.names import parse_adapter_ref
from loraserve.inference.adapters import AdapterRegistry
from loraserve.inference.engine import AdapterHandle, SamplingSpec, VllmEngine
from loraserve.inference.serving.generation import GenerateCommand, Generator, SamplingRequest


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


async def _handle(
    registry: AdapterRegistry, handles: dict[str, AdapterHandle | None], name: str
) -> AdapterHandle | None:
    """The engine handle `name` routes to (None: the base model), looked up once: the
    benchmark's adapters stay loaded while it runs."""
    if name not in handles:
        async with registry.acquire(parse_adapter_ref(name)) as lease:
            handles[name] = lease.adapter
    return handles[name]


def direct_caller(engine: VllmEngine, registry: AdapterRegistry) -> Caller:
    """vLLM through VllmEngine.generate alone: no validation, admission or lease."""
    handles: dict[str, AdapterHandle | None] = {}

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        handle = await _handle(registry, handles, adapter)
        # vLLM's own params, built here: the baseline pays nothing of loraserve's mapping.
        spec = SamplingSpec(max_tokens=max_tokens, n=1, params=greedy_params(max_tokens))
        async for delta in engine.generate(uuid.uuid4().hex, prompt, spec, handle):
            yield len(delta.token_ids), 0

    return call
