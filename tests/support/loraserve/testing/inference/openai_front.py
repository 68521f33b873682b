"""The OpenAI-compatible front on a fake engine over real HTTP on 127.0.0.1, for its unit tests.

`start_front`, a fixture, starts fronts with adapter alpha@3 and stops them after the test.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from loraserve.common.rpc.security import ServerSecurity
from loraserve.inference.adapters import LLAMA_TARGET_MODULES, AdapterRegistry, CompatibilityChecker
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.openai import RunningHttpServer, create_openai_app, start_http_server
from loraserve.inference.serving import Admission, Generator, Runtime, RuntimeRef
from loraserve.testing.fakes.engine import CacheDirectory, FakeEngine, make_revision

MODEL = "fake-llama"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
CHAT: dict[str, object] = {"messages": MESSAGES}


@dataclass
class Front:
    engine: FakeEngine
    runtime_ref: RuntimeRef
    server: RunningHttpServer
    url: str

    def client(self, api_key: str = "unused") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0)


StartFront = Callable[..., Awaitable[Front]]


@pytest.fixture
async def start_front(tmp_path: Path) -> AsyncIterator[StartFront]:
    # The fake engine builds vLLM's sampling parameters, as the real one does: imported
    # here, the first request of a session does not pay the seconds vLLM's import takes
    # (longer than an HTTP client's timeout on a loaded machine).
    await asyncio.to_thread(importlib.import_module, "vllm.sampling_params")
    servers: list[RunningHttpServer] = []

    async def start(
        engine: FakeEngine | None = None,
        security: ServerSecurity | None = None,
        runtime: bool = True,
        max_pending: int = 8,
        stalled_write_s: float | None = None,
    ) -> Front:
        engine = engine or FakeEngine()
        compat = CompatibilityChecker(
            max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name=MODEL
        )
        registry = AdapterRegistry(engine, CacheDirectory(tmp_path), compat)
        await registry.install(make_revision(tmp_path, "alpha", 3).manifest, make_current=True)
        admission = Admission(max_pending)
        runtime_ref = RuntimeRef()
        if runtime:
            generator = Generator(engine, registry, admission, InferenceMetrics())
            runtime_ref.set(Runtime(engine, registry, generator, admission, replica_id="r"))
        app = create_openai_app(
            runtime_ref,
            model_names=[MODEL, f"/models/{MODEL}"],
            security=security or ServerSecurity(),
            is_ready=lambda: runtime,
            stalled_write_s=stalled_write_s,
        )
        server = await start_http_server(
            app, address="127.0.0.1:0", security=ServerSecurity(), stalled_write_s=stalled_write_s
        )
        servers.append(server)
        return Front(engine, runtime_ref, server, f"http://127.0.0.1:{server.port}")

    yield start
    for server in servers:
        await server.stop(grace=None)


async def _post(front: Front, path: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=front.url) as http:
        return await http.post(path, json=body)
