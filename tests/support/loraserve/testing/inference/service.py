"""The inference gRPC service on the session's real vLLM engine, without the store.

`served_factory()` yields one `Served`: a registry over a temporary adapter cache,
the real generator and servicer on 127.0.0.1, port 0. Adapters are installed
straight into the registry from a built adapter directory (`served.install`), and
pinned revisions are fetched from `served.fetcher.sources`. When the `async for`
ends, every adapter the test loaded is removed from the engine again.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from loraserve.common.config.pins import PinPolicy, PinSettings
from loraserve.common.errors import NotFound
from loraserve.common.revisions.manifest import Revision
from loraserve.common.rpc.security import ServerSecurity
from loraserve.inference.adapters import (
    AdapterRegistry,
    CompatibilityChecker,
    RevisionCache,
    model_lora_targets,
)
from loraserve.inference.cache import CachedRevision
from loraserve.inference.engine import Engine
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.openai import create_openai_app, start_http_server
from loraserve.inference.serving import (
    SERVICE_NAME,
    Admission,
    Generator,
    Runtime,
    RuntimeRef,
    register,
)
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.engine.holding import HoldingEngine
from loraserve.testing.fakes.engine import CacheDirectory, fake_manifest
from loraserve.testing.grpc import serving

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

REPLICA_ID = "test-replica"
# Guards against a hang only; nothing here measures time.
IDLE_GUARD_S = 60.0


async def wait_until_idle(engine: Engine, guard_s: float = IDLE_GUARD_S) -> int:
    """Waits until the engine holds no request; returns what it holds then (0)."""
    async with asyncio.timeout(guard_s):
        while True:
            stats = engine.stats()
            if stats.running + stats.waiting == 0:
                return 0
            await asyncio.sleep(0.02)


def copy_revision(source: Path, cache_dir: Path, name: str, revision: int) -> CachedRevision:
    path = cache_dir / name / str(revision)
    if not path.exists():
        shutil.copytree(source, path)
    config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
    manifest = fake_manifest(
        name,
        revision,
        rank=int(config["r"]),
        target_modules=tuple(sorted(config["target_modules"])),
        base_model=str(config.get("base_model_name_or_path") or ""),
    )
    return CachedRevision(manifest, path)


def tiny_registry(
    engine: Engine,
    model_dir: Path,
    cache: RevisionCache,
    *,
    served_model_name: str | None = None,
    **options: Any,
) -> AdapterRegistry:
    """A registry over `cache` that admits what the engine on the tiny model can serve
    and serves every pinned revision; `options` (observer, pins) go to AdapterRegistry."""
    compat = CompatibilityChecker(
        max_lora_rank=engine.info.max_lora_rank,
        target_modules=model_lora_targets(model_dir),
        served_model_name=served_model_name or str(model_dir),
    )
    return AdapterRegistry(engine, cache, compat, **{"pins": PinSettings(PinPolicy.ANY), **options})


def make_runtime_ref(
    engine: Engine,
    registry: AdapterRegistry,
    metrics: InferenceMetrics,
    *,
    max_pending: int = 16,
    max_n: int | None = None,
    replica_id: str = REPLICA_ID,
    **runtime: Any,
) -> RuntimeRef:
    """The generation path over `registry`, as the servicers and the HTTP front reach it."""
    admission = Admission(max_pending, max_n)
    return RuntimeRef(
        Runtime(
            engine=engine,
            registry=registry,
            generator=Generator(engine, registry, admission, metrics),
            admission=admission,
            replica_id=replica_id,
            **runtime,
        )
    )


@asynccontextmanager
async def openai_server(
    runtime_ref: RuntimeRef, model_name: str, **options: Any
) -> AsyncIterator[int]:
    """The OpenAI-compatible front over `runtime_ref` on 127.0.0.1; yields its port. `options`
    go to `create_openai_app` (security, metrics)."""
    app = create_openai_app(
        runtime_ref,
        model_names=[model_name],
        is_ready=lambda: True,
        **{"security": ServerSecurity(), **options},
    )
    server = await start_http_server(app, address="127.0.0.1:0", security=ServerSecurity())
    try:
        yield server.port
    finally:
        await server.stop(grace=None)


class DirectoryFetcher(CacheDirectory):
    """Fetches revisions from built adapter directories: `sources[(name, rev)] = dir`."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(cache_dir)
        self.sources: dict[tuple[str, int], Path] = {}

    async def download(self, name: str, revision: int, manifest: Revision | None) -> CachedRevision:
        source = self.sources.get((name, revision))
        if source is None:
            raise NotFound(f"adapter {name}@{revision} not found")
        return await asyncio.to_thread(copy_revision, source, self.cache_dir, name, revision)

    async def remove(self, name: str, revision: int) -> None:
        await super().remove(name, revision)
        path = self.cache_dir / name / str(revision)
        await asyncio.to_thread(shutil.rmtree, path, True)


@dataclass
class Served:
    """The service under test and the parts a test may reach into."""

    address: str
    stub: Any
    # The session's engine; it holds a stream in flight when a test asks it to.
    engine: HoldingEngine
    registry: AdapterRegistry
    fetcher: DirectoryFetcher
    runtime_ref: RuntimeRef
    cache_dir: Path

    async def install(self, name: str, revision: int, source: Path) -> None:
        """Copies `source` into the cache as name@revision and makes it current."""
        self.fetcher.sources[(name, revision)] = source
        rev = await asyncio.to_thread(copy_revision, source, self.cache_dir, name, revision)
        await self.registry.install(rev.manifest, make_current=True)


@pytest.fixture
def served_factory(
    vllm_engine: AsyncLLM, tiny_model_dir: Path, tmp_path: Path
) -> Callable[..., AsyncIterator[Served]]:
    """`async for served in served_factory(max_pending=64): ...` runs one Served."""

    async def serve(max_pending: int = 64) -> AsyncIterator[Served]:
        engine = HoldingEngine(vllm_engine, [])
        loaded_before = await engine.list_loras()
        cache_dir = tmp_path / "adapter-cache"
        cache_dir.mkdir(exist_ok=True)
        fetcher = DirectoryFetcher(cache_dir)
        metrics = InferenceMetrics(CollectorRegistry())
        registry = tiny_registry(engine, tiny_model_dir, fetcher, observer=metrics)
        runtime_ref = make_runtime_ref(engine, registry, metrics, max_pending=max_pending)
        try:
            async with serving(
                lambda server: register(server, runtime_ref), [SERVICE_NAME]
            ) as running:
                address = f"127.0.0.1:{running.port}"
                async with grpc.aio.insecure_channel(address) as channel:
                    yield Served(
                        address,
                        pb_grpc.InferenceServiceStub(channel),
                        engine,
                        registry,
                        fetcher,
                        runtime_ref,
                        cache_dir,
                    )
        finally:
            await wait_until_idle(engine)
            await registry.wait_background()
            for lora_id in await engine.list_loras() - loaded_before:
                await engine.remove_lora(lora_id)

    return serve
