"""What a load generator drives: a `Target` names a server and how to call it; each
kind opens its client for one arm run and closes it after (a fresh connection pool per
run, so no arm inherits another's idle connections)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

from bench.load.calls import (
    Reconnects,
    grpc_caller,
    grpc_stub_caller,
    http_session,
    no_retry_client,
    openai_caller,
    openai_sdk_caller,
    routed_caller,
    stub_channel,
    vllm_grpc_caller,
)
from bench.load.workload import Caller
from loraserve.clients.balancing import BoundedLoad
from loraserve.clients.inference import InferenceClient

# Stops a call a hung proxy holds; nothing measured comes near it.
PROXY_CALL_TIMEOUT_S = 300.0

KINDS = {
    "grpc": "loraserve's InferenceClient.stream",
    "grpc_stub": "the raw generated gRPC stub, one message per token",
    "openai": "streamed /v1/completions with aiohttp",
    "openai_sdk": "streamed completions with openai.AsyncOpenAI",
    "vllm_grpc": "vLLM's own gRPC Generate",
    "grpc_routes": "InferenceClient.stream, each adapter to its own server (ADAPTER=ADDR;...)",
    "thin": "bench.load.thin (the engine with nothing of a server in between)",
    "fleet_ring_hash": "one channel over every replica, ring_hash on the adapter header",
    "fleet_round_robin": "one channel over every replica, round robin",
    "fleet_bounded": "InferenceClient over every replica: bounded-load adapter affinity",
    "fleet_proxy": "one channel to a load balancer (HAProxy), the adapter header on each call",
}


@dataclass(frozen=True)
class Target:
    """`kind` (one of KINDS) at `address` (replicas comma-separated for fleet kinds);
    `base_model`: the model name the OpenAI arms send for base-model requests."""

    kind: str
    address: str
    base_model: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown target kind {self.kind!r}; one of {sorted(KINDS)}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@asynccontextmanager
async def caller_for(target: Target) -> AsyncIterator[tuple[Caller, Reconnects]]:
    """The caller for `target`, its client open; and the count of HTTP requests sent
    again on a fresh connection (see bench.load.calls.Reconnects)."""
    reconnects = Reconnects()
    kind, address = target.kind, target.address
    if kind == "grpc":
        async with no_retry_client(address) as client:
            yield grpc_caller(client), reconnects
    elif kind == "grpc_stub":
        async with stub_channel(address) as channel:
            yield grpc_stub_caller(channel), reconnects
    elif kind == "openai":
        async with http_session() as http:
            yield openai_caller(http, address, target.base_model, reconnects), reconnects
    elif kind == "openai_sdk":
        async with _sdk(address) as client:
            yield openai_sdk_caller(client, target.base_model), reconnects
    elif kind == "vllm_grpc":
        async with stub_channel(address) as channel:
            yield vllm_grpc_caller(channel), reconnects
    elif kind == "grpc_routes":
        async with contextlib.AsyncExitStack() as stack:
            callers = {}
            for route in address.split(";"):
                adapter, _, server = route.partition("=")
                client = await stack.enter_async_context(no_retry_client(server))
                callers[adapter] = grpc_caller(client)
            yield routed_caller(callers), reconnects
    elif kind == "fleet_bounded":
        async with InferenceClient(address, routing=BoundedLoad()) as client:
            yield grpc_caller(client), reconnects
    elif kind == "fleet_proxy":
        async with stub_channel(address) as channel:
            yield grpc_stub_caller(channel, affinity=True, timeout=PROXY_CALL_TIMEOUT_S), reconnects
    elif kind == "thin":
        from bench.load.thin import ThinClient

        thin = ThinClient(address)
        try:
            yield thin.stream, reconnects
        finally:
            await thin.close()
    else:
        from bench.fleet.rig import fleet_caller, fleet_channel

        ring = kind == "fleet_ring_hash"
        async with fleet_channel(
            address.split(","), "ring_hash" if ring else "round_robin"
        ) as channel:
            yield fleet_caller(channel), reconnects


@asynccontextmanager
async def _sdk(base_url: str) -> AsyncIterator[Any]:
    import httpx2
    from openai import AsyncOpenAI, DefaultAsyncHttpx2Client

    # As many connections as streams, as aiohttp's arms have.
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)
    client = AsyncOpenAI(
        base_url=base_url + "/v1",
        api_key="unused",
        max_retries=0,
        timeout=None,
        http_client=DefaultAsyncHttpx2Client(limits=limits, timeout=None),
    )
    try:
        yield client
    finally:
        await client.close()
