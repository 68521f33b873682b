"""Routing across inference replicas when they come and go: ring_hash skips a replica
that is not SERVING, servers end old connections so clients resolve names again, and
a `dns:///` target works over TLS.

Real gRPC servers on 127.0.0.1: one with the session's vLLM engine, one still starting
(no runtime, health NOT_SERVING), as a replica is while its engine loads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.clients.inference import InferenceClient, RetryPolicy, Sampling
from loraserve.common.errors import NotFound
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity
from loraserve.common.rpc.server import start_server
from loraserve.inference.app import InferenceApp
from loraserve.inference.serving import SERVICE_NAME, RuntimeRef, register
from loraserve.inference.settings import parse_settings
from loraserve.testing.certs import make_certs
from loraserve.testing.grpc import serving
from loraserve.testing.inference.service import Served
from loraserve.testing.waiting import GUARD_S

# Few quick retries: a call that lands on the starting replica fails fast.
QUICK = RetryPolicy(max_attempts=2, initial_backoff=0.05, max_backoff=0.1)


@pytest.fixture
async def served(served_factory: Callable[..., AsyncIterator[Served]]) -> AsyncIterator[Served]:
    async for running in served_factory():
        yield running


@pytest.mark.engine
async def test_routing_sends_a_starting_replicas_adapters_to_a_serving_one(
    served: Served,
) -> None:
    starting = await start_server(
        address="127.0.0.1:0",
        register=lambda server: register(server, RuntimeRef()),
        service_names=[SERVICE_NAME],
        security=ServerSecurity(),
    )
    try:
        replicas = f"{served.address},127.0.0.1:{starting.port}"
        async with InferenceClient(replicas, retry=QUICK, timeout=GUARD_S) as client:
            # Unknown adapters: the serving replica answers NOT_FOUND at once, without the
            # engine running anything; the starting one would answer UNAVAILABLE. Sixteen
            # names land on both replicas of the ring unless health steers them.
            for i in range(16):
                with pytest.raises(NotFound):
                    await client.generate(f"probe-{i}", "hello", Sampling(max_tokens=1))
    finally:
        await starting.stop(grace=None)


async def test_a_server_ends_connections_older_than_max_connection_age(tmp_path: Path) -> None:
    argv = ["serve", "--model", str(tmp_path / "model"), "--store", "127.0.0.1:1"]
    argv += ["--adapter-cache", str(tmp_path / "cache"), "--listen", "127.0.0.1:0"]
    app = InferenceApp(parse_settings([*argv, "--max-connection-age", "0.5"], {}, "r"))
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert channel.get_state() is grpc.ChannelConnectivity.READY
            # The server's GOAWAY leaves the channel without a connection (IDLE).
            async with asyncio.timeout(GUARD_S):
                await channel.wait_for_state_change(grpc.ChannelConnectivity.READY)
            assert channel.get_state() is not grpc.ChannelConnectivity.READY
    finally:
        await app.stop()


@pytest.mark.engine
async def test_a_dns_target_reaches_a_replica_over_tls(served: Served, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    tls = ServerSecurity(tls_cert_file=certs.server_cert, tls_key_file=certs.server_key)
    async with serving(
        lambda server: register(server, served.runtime_ref), [SERVICE_NAME], tls
    ) as tls_server:
        target = f"dns:///localhost:{tls_server.port}"
        security = ClientSecurity(tls_ca_file=certs.ca_cert)
        async with InferenceClient(target, security, timeout=GUARD_S) as client:
            completion = await client.generate("", "hello", Sampling(max_tokens=2, ignore_eos=True))
    assert completion.completion_tokens == 2
