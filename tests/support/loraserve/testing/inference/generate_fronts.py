"""Generate served again over another transport beside an inference app's own grpc.aio
server, for tests/test_generate_transports*.py: over bench/front/grpclib_front.py's
grpclib probe, or over the service's native transport (Rust's h2) with the engine's
outputs pulled or pushed; and, as fixtures, an app serving `alpha` on the session's
engine with the port of its Generate over the native transport."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loraserve.common.rpc.security import ServerSecurity
from loraserve.inference.serving import RuntimeRef
from loraserve.inference.transport import NativeFront, start_generate_front
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import RunningInference, adapter_files, inference_app
from loraserve.testing.inference.native import native_only
from loraserve.testing.store.server import RunningStore

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

# The app's own server is the reference: grpc.aio serves everything on it.
GRPCIO = ("--grpc-transport", "grpcio")


@contextlib.asynccontextmanager
async def generate_transport(kind: str, running: RunningInference) -> AsyncIterator[int]:
    """The port of Generate served again over `kind`, beside the app's own server."""
    if kind == "grpclib":
        # Imported here: this plugin loads in every session, the bench's probe (and
        # grpclib) only where a test asks for it.
        from bench.front.grpclib_front import serve_generate

        server, port = await serve_generate(running.app.runtime_ref)
        try:
            yield port
        finally:
            server.close()
            await server.wait_closed()
        return
    front = native_generate_front(running.app.runtime_ref, pushed=kind == "pushed")
    try:
        yield front.port
    finally:
        front.close()


def native_generate_front(
    runtime_ref: RuntimeRef,
    *,
    pushed: bool = True,
    security: ServerSecurity | None = None,
    upstream: str | None = None,
) -> NativeFront:
    """Generate on the native transport, on an ephemeral port of 127.0.0.1."""
    return start_generate_front(
        runtime_ref,
        host="127.0.0.1",
        port=0,
        security=security or ServerSecurity(),
        upstream=upstream,
        max_connection_age_s=None,
        pushed=pushed,
    )


@pytest.fixture
async def running_app(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[RunningInference]:
    """An inference server serving `alpha`, grpc.aio serving everything on it: the
    reference, for tests that serve its Generate again over another transport."""
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        extra=GRPCIO,
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
    ) as running:
        yield running


@pytest.fixture(params=[pytest.param(kind, marks=native_only) for kind in ("native", "pushed")])
async def served_natively(
    request: pytest.FixtureRequest, running_app: RunningInference
) -> AsyncIterator[tuple[RunningInference, int]]:
    """That server, and the port of its Generate over the native transport, the engine's
    outputs pulled or pushed."""
    async with generate_transport(request.param, running_app) as port:
        yield running_app, port
