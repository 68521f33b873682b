"""A whole inference server (InferenceApp: gRPC, store sync, registry, generation)
in-process on the session's vLLM engine, for tests that fault, restart or stop it.

The engine outlives each app: stopping an app leaves the engine running, and the
LoRAs the app loaded are removed afterwards, so the next test finds the engine as
it was. `add_calls` records every adapter handed to the engine, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from loraserve.inference.app import InferenceApp
from loraserve.inference.engine import AdapterHandle, VllmEngine
from loraserve.inference.settings import EngineOptions, parse_settings
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.processes.services import inference_args
from loraserve.testing.store.calls import push, store_stub

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

# Guards against a hang only; nothing here measures time.
READY_GUARD_S = 120.0
PROMPT = (5, 17, 42, 99, 3, 250, 7, 64)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class SharedEngine(VllmEngine):
    """The session's engine, which outlives any one app; records every add_lora."""

    def __init__(self, llm: AsyncLLM, add_calls: list[str]) -> None:
        super().__init__(llm)
        self._add_calls = add_calls

    async def add_lora(self, adapter: AdapterHandle) -> None:
        self._add_calls.append(adapter.lora_name)
        await super().add_lora(adapter)

    def shutdown(self) -> None:
        pass


@dataclass
class RunningInference:
    """An in-process inference server a test reaches at `address`."""

    app: InferenceApp
    address: str
    stub: Any
    engine: SharedEngine
    # lora_name ("<name>@<revision>") of every add_lora the app made, in order.
    add_calls: list[str] = field(default_factory=list)

    async def generate(
        self, adapter: str, max_tokens: int = 8, *, timeout: float = 60
    ) -> tuple[int, tuple[int, ...]]:
        """The revision that served a greedy generation, and its token ids."""
        revision = 0
        tokens: list[int] = []
        async for message in self.stub.Generate(greedy(adapter, max_tokens), timeout=timeout):
            revision = revision or message.revision
            tokens.extend(message.token_ids)
        return revision, tuple(tokens)

    async def current(self, name: str) -> int:
        """The revision the server routes `name` to; 0 if none."""
        response = await self.stub.ListAdapters(pb.ListAdaptersRequest(), timeout=10)
        return next((s.revision for s in response.adapters if s.name == name and s.current), 0)

    async def routes(self, name: str, revision: int) -> bool:
        """Whether the server routes `name` to `revision` (0: to none), for `eventually`."""
        return await self.current(name) == revision

    async def statuses(self, name: str) -> dict[int, Any]:
        response = await self.stub.ListAdapters(pb.ListAdaptersRequest(), timeout=10)
        return {s.revision: s for s in response.adapters if s.name == name}

    async def in_engine(self) -> int:
        """Requests the engine holds now, running or waiting."""
        info = await self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
        return int(info.running_requests + info.waiting_requests)


def greedy(adapter: str, max_tokens: int, prompt: Sequence[int] = PROMPT) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        adapter=adapter,
        token_ids=pb.TokenIds(ids=list(prompt)),
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def adapter_files(adapter_dir: Path) -> AdapterFiles:
    return {name: (adapter_dir / name).read_bytes() for name in ADAPTER_FILES}


@asynccontextmanager
async def inference_app(
    llm: AsyncLLM,
    *,
    model_dir: Path,
    store_address: str,
    cache_dir: Path,
    replica_id: str = "reliability-replica",
    extra: Sequence[str] = (),
    wait_ready: bool = True,
    engine_type: type[SharedEngine] = SharedEngine,
    pushed: Mapping[str, AdapterFiles] | None = None,
) -> AsyncIterator[RunningInference]:
    """Runs an InferenceApp on the shared engine (wrapped in `engine_type`) until the
    block exits (then stops it gracefully and removes the LoRAs it loaded); `pushed`
    (name -> files) goes to the store first, so the app's first sync serves it."""
    if pushed:
        async with store_stub(store_address) as store:
            for name, files in pushed.items():
                await push(store, name, files)
    settings = parse_settings(
        inference_args(model_dir, store_address, cache_dir, "--shutdown-grace", "30", *extra),
        {},
        replica_id,
    )
    owner = VllmEngine(llm)
    loaded_before = await owner.list_loras()
    add_calls: list[str] = []
    engine = engine_type(llm, add_calls)

    async def start_engine(options: EngineOptions) -> VllmEngine:
        return engine

    app = InferenceApp(settings, start_engine=start_engine)
    await app.start()
    starting = asyncio.create_task(app.run_engine_and_sync(), name="test-inference-start")
    try:
        if wait_ready:
            async with asyncio.timeout(READY_GUARD_S):
                await app.ready.wait()
        address = f"127.0.0.1:{app.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.InferenceServiceStub(channel)
            yield RunningInference(app, address, stub, engine, add_calls)
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await app.stop()
        for lora_id in await owner.list_loras() - loaded_before:
            await owner.remove_lora(lora_id)
