"""A replica's gRPC port on grpc.aio survives peers that misbehave on purpose, on the
session's real engine: during and after each attack a normal client still streams
Generate, Health tells the truth, the server's memory stays bounded and nothing the
attacker started is left held. The short variant of each attack class; the replica runs
with a reader token and the stalled-write and handshake clocks shortened. (The OpenAI
front's stalled reader: services/inference/tests/openai/test_openai_streaming.py, whose engine
can make more output than the kernel's socket buffers hold; this engine's context
cannot.)"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.common.config.sizes import MESSAGE_LIMIT
from loraserve.inference.serving import GENERATE_METHOD
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.abuse import (
    RawPeer,
    call_headers,
    closed_by_server,
    grpc_frame,
    gzip_bomb,
    peak_rss_growth,
    unfinished_bodies_without_a_token,
)
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.session import MAX_MODEL_LEN
from loraserve.testing.inference.app import (
    PROMPT,
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

TOKEN = "abuse-reader-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
STALLED_WRITE_S = 2
HANDSHAKE_S = 2
# What an attack may add to the server's peak RSS: the server should hold nothing of it
# but a few MiB of bookkeeping.
RSS_BOUND = 64 * 1024 * 1024
HEALTH_METHOD = "/grpc.health.v1.Health/Check"
# Tokens an attacker's call asks for: as many as the session engine's context holds, so
# its generation outlives the stalled-write clock.
LONG = MAX_MODEL_LEN - len(PROMPT)


@pytest.fixture
async def replica(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    store_server: RunningStore,
    tmp_path: Path,
) -> AsyncIterator[RunningInference]:
    async with inference_app(
        vllm_engine,
        model_dir=tiny_model_dir,
        store_address=store_server.address,
        cache_dir=tmp_path / "cache",
        extra=(
            "--grpc-transport",
            "grpcio",
            "--reader-token",
            f"abuse:{TOKEN}",
            "--stalled-write-timeout",
            str(STALLED_WRITE_S),
            "--handshake-timeout",
            str(HANDSHAKE_S),
        ),
        pushed={"alpha": adapter_files(tiny_adapter(seed=1))},
    ) as running:
        yield running


async def _streams_normally(replica: RunningInference) -> None:
    """A well-behaved client's Generate streams every token, and Health says SERVING."""
    tokens = 0
    async for message in replica.stub.Generate(greedy("alpha", 8), metadata=AUTH, timeout=60):
        tokens += len(message.token_ids)
    assert tokens == 8
    async with grpc.aio.insecure_channel(replica.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        status = await health.Check(health_pb2.HealthCheckRequest(), metadata=AUTH, timeout=10)
    assert status.status == health_pb2.HealthCheckResponse.SERVING


async def _nothing_held(replica: RunningInference) -> None:
    """No sequence is admitted any more: every call the attack started has ended and
    released its engine request."""

    async def idle() -> bool:
        load = await replica.stub.GetReplicaLoad(
            pb.GetReplicaLoadRequest(), metadata=AUTH, timeout=10
        )
        return bool(load.pending_sequences == 0)

    await eventually(idle, "no sequence admitted")


def _generate_body(max_tokens: int) -> bytes:
    return grpc_frame(greedy("alpha", max_tokens).SerializeToString())


async def test_a_request_headers_frame_carrying_status_ends_only_its_connection(
    replica: RunningInference,
) -> None:
    peer = RawPeer(replica.app.port)
    try:
        peer.open(call_headers(GENERATE_METHOD, TOKEN), _generate_body(LONG))
        peer.open_raw([(":status", "103"), *call_headers(GENERATE_METHOD, TOKEN)])
        await asyncio.to_thread(peer.read, 1.0)
        await _streams_normally(replica)
    finally:
        peer.close()
    await _nothing_held(replica)


async def test_a_client_that_never_reads_has_its_calls_ended_and_released(
    replica: RunningInference,
) -> None:
    # A zero window: the server may send these 20 streams no byte of any message.
    peer = RawPeer(replica.app.port, initial_window=0)
    cancelled_before = _cancelled(replica)
    try:
        with peak_rss_growth() as growth:
            for _ in range(20):
                peer.open(call_headers(GENERATE_METHOD, TOKEN), _generate_body(LONG))
            await _streams_normally(replica)

            # Past the stalled-write clock the server ends each call and its engine
            # request, though its client never read a byte of it (a call left to finish
            # would count OK).
            async def every_call_ended() -> bool:
                # Reading answers the server's pings and SETTINGS, as a live client does:
                # only its zero window keeps every message from it.
                assert await asyncio.to_thread(peer.read, 0.05)
                return _cancelled(replica) - cancelled_before >= 20

            await eventually(every_call_ended, "every call ended")
            await _nothing_held(replica)
            await _streams_normally(replica)
        assert growth[0] < RSS_BOUND
    finally:
        peer.close()


def _cancelled(replica: RunningInference) -> float:
    """Generate calls on `alpha` the replica ended before their generation did."""
    sample = replica.app.metrics.registry.get_sample_value(
        "loraserve_inference_requests_total", {"adapter": "alpha", "code": "CANCELLED"}
    )
    return sample or 0.0


async def test_unfinished_bodies_without_a_token_are_refused_before_they_are_read(
    replica: RunningInference,
) -> None:
    growth = await unfinished_bodies_without_a_token(
        replica.app.port, GENERATE_METHOD, lambda: _streams_normally(replica)
    )
    assert growth < RSS_BOUND


async def test_idle_connections_hold_no_client_out_and_are_closed_after_the_handshake_timeout(
    replica: RunningInference,
) -> None:
    with peak_rss_growth() as growth:
        idle = [socket.create_connection(("127.0.0.1", replica.app.port)) for _ in range(1000)]
        try:
            await _streams_normally(replica)
            await eventually(
                lambda: all(closed_by_server(sock) for sock in idle), "every idle one closed"
            )
        finally:
            for sock in idle:
                sock.close()
    assert growth[0] < RSS_BOUND
    await _streams_normally(replica)


@pytest.mark.parametrize("method", [GENERATE_METHOD, HEALTH_METHOD])
async def test_calls_reset_as_soon_as_they_start_leave_nothing_held(
    replica: RunningInference, method: str
) -> None:
    body = (
        _generate_body(LONG)
        if method == GENERATE_METHOD
        else grpc_frame(health_pb2.HealthCheckRequest().SerializeToString())
    )
    peer = RawPeer(replica.app.port)
    try:
        with peak_rss_growth() as growth:

            def reset_loop() -> int:
                """Rounds done before the server closed the connection, if it did."""
                for done in range(2000):
                    stream = peer.open(call_headers(method, TOKEN), body)
                    peer.reset(stream)
                    if not peer.read(0):
                        return done
                return 2000

            # grpc.aio keeps such a connection open: every round reached the server.
            assert await asyncio.to_thread(reset_loop) == 2000
            await _streams_normally(replica)
        assert growth[0] < RSS_BOUND
    finally:
        peer.close()
    await _nothing_held(replica)


async def test_gzip_bombs_are_refused_before_they_are_inflated(replica: RunningInference) -> None:
    bomb = gzip_bomb(MESSAGE_LIMIT + 1)
    peer = RawPeer(replica.app.port)
    try:
        with peak_rss_growth() as growth:
            streams = [
                peer.open(call_headers(GENERATE_METHOD, TOKEN, encoding="gzip"), bomb)
                for _ in range(50)
            ]

            await eventually(lambda: asyncio.to_thread(peer.ended, streams), "every stream ended")
            await _streams_normally(replica)
        assert growth[0] < RSS_BOUND
        # Inflated, each would have ended RESOURCE_EXHAUSTED at the message limit.
        unimplemented = str(grpc.StatusCode.UNIMPLEMENTED.value[0])
        assert {peer.endings[stream] for stream in streams} == {unimplemented}
    finally:
        peer.close()
