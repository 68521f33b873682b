"""Every attack of the abuse suite at full size against a replica's ports, on each gRPC
transport: its Generate port (a) to (f), its OpenAI port (g) and its metrics port (d).
During and after each, 8 normal clients stream Generate in a closed loop with no
failure and a time-to-first-token p99 within 2x of before; the replica's peak RSS stays
within 256 MiB of before; Health says SERVING; and afterwards no sequence is admitted
and no attacker's connection is held."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from loraserve.inference.serving import GENERATE_METHOD
from loraserve.testing.abuse import call_headers, grpc_frame
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.attack_figures import run_attack
from loraserve.testing.attacks import (
    gzip_bombs,
    idle_connections,
    reset_loop,
    status_headers,
    unfinished_bodies,
    unread_sse,
    zero_window,
)
from loraserve.testing.engine.session import MAX_MODEL_LEN
from loraserve.testing.inference.app import PROMPT, greedy
from loraserve.testing.inference.native import native_only
from loraserve.testing.processes.abused import (
    ATTACKER_ADAPTER,
    ATTACKER_TOKEN,
    AbusedReplica,
    abused_replica,
)
from loraserve.testing.store.server import RunningStore

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HEALTH_METHOD = "/grpc.health.v1.Health/Check"
# An attacker's Generate: as many tokens as the context holds.
LONG_BODY = grpc_frame(greedy(ATTACKER_ADAPTER, MAX_MODEL_LEN - len(PROMPT)).SerializeToString())
HEALTH_BODY = grpc_frame(health_pb2.HealthCheckRequest().SerializeToString())
GENERATE = call_headers(GENERATE_METHOD, ATTACKER_TOKEN)


@pytest.fixture(scope="module", params=["grpcio", pytest.param("native", marks=native_only)])
async def replicas(
    request: pytest.FixtureRequest,
    module_store_server: RunningStore,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Callable[[], Awaitable[AbusedReplica]]]:
    """The module's replica on one transport, started again where an attack ended its
    process (a transport that fails stops its service), so that the attacks after it
    are measured on a replica of their own."""
    transport: str = request.param
    directory = tmp_path_factory.mktemp(f"abused-{transport}")
    async with contextlib.AsyncExitStack() as stack:
        current: list[AbusedReplica] = []

        async def running() -> AbusedReplica:
            if current and current[0].process.process.returncode is None:
                return current[0]
            if current:
                await stack.aclose()
                current.clear()
            current.append(
                await stack.enter_async_context(
                    abused_replica(
                        transport,
                        module_store_server.address,
                        tiny_model_dir,
                        tiny_adapter,
                        directory,
                    )
                )
            )
            return current[0]

        yield running


@pytest.fixture
async def replica(replicas: Callable[[], Awaitable[AbusedReplica]]) -> AbusedReplica:
    return await replicas()


async def test_request_headers_carrying_status_103(
    replica: AbusedReplica, pytestconfig: pytest.Config
) -> None:
    # Mid-connection: the frame comes while the same connection's call streams.
    attack = status_headers
    await run_attack(
        replica, "a_status_103", lambda port: attack(port, GENERATE, LONG_BODY), pytestconfig
    )


async def test_twenty_zero_window_streams_beside_eight_normal_clients(
    replica: AbusedReplica, pytestconfig: pytest.Config
) -> None:
    await run_attack(
        replica, "b_zero_window", lambda port: zero_window(port, GENERATE, LONG_BODY), pytestconfig
    )


async def test_two_hundred_unfinished_bodies_without_a_token(
    replica: AbusedReplica, pytestconfig: pytest.Config
) -> None:
    await run_attack(
        replica,
        "c_unfinished_bodies",
        lambda port: unfinished_bodies(port, GENERATE_METHOD),
        pytestconfig,
    )


async def test_five_thousand_idle_connections(
    replica: AbusedReplica, pytestconfig: pytest.Config
) -> None:
    await run_attack(
        replica, "d_idle_connections", lambda port: idle_connections(port, 5000), pytestconfig
    )


@pytest.mark.parametrize("method", [GENERATE_METHOD, HEALTH_METHOD], ids=["generate", "health"])
async def test_calls_reset_as_soon_as_answered(
    replica: AbusedReplica, pytestconfig: pytest.Config, method: str
) -> None:
    body = LONG_BODY if method == GENERATE_METHOD else HEALTH_BODY
    headers = call_headers(method, ATTACKER_TOKEN)
    name = f"e_reset_loop_{method.rsplit('/', 1)[1].lower()}"
    await run_attack(replica, name, lambda port: reset_loop(port, headers, body), pytestconfig)


async def test_five_hundred_gzip_bombs_with_deadlines(
    replica: AbusedReplica, pytestconfig: pytest.Config
) -> None:
    headers = call_headers(GENERATE_METHOD, ATTACKER_TOKEN, encoding="gzip")
    await run_attack(replica, "f_gzip_bombs", lambda port: gzip_bombs(port, headers), pytestconfig)


async def test_sixteen_openai_streams_never_read(
    replica: AbusedReplica, pytestconfig: pytest.Config
) -> None:
    body = json.dumps(
        {
            "model": ATTACKER_ADAPTER,
            "prompt": list(PROMPT),
            "max_tokens": MAX_MODEL_LEN - len(PROMPT),
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    await run_attack(
        replica,
        "g_unread_sse",
        lambda port: unread_sse(port, ATTACKER_TOKEN, body),
        pytestconfig,
        port=replica.openai_port,
    )


async def test_five_thousand_idle_connections_on_the_metrics_port(
    replica: AbusedReplica, pytestconfig: pytest.Config
) -> None:
    async def scraped_from_another_address() -> None:
        # The caps are per address: a scraper elsewhere is still served.
        assert await asyncio.to_thread(_scrape, replica.metrics_port, "127.0.0.2") == 200

    await run_attack(
        replica,
        "d_idle_metrics",
        lambda port: idle_connections(port, 5000),
        pytestconfig,
        port=replica.metrics_port,
        meanwhile=scraped_from_another_address,
    )


def _scrape(port: int, source: str) -> int:
    """The status of one scrape of the metrics port from `source`."""
    connection = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=10, source_address=(source, 0)
    )
    try:
        connection.request("GET", "/metrics")
        return connection.getresponse().status
    finally:
        connection.close()
