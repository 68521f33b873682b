"""The limits a gRPC server puts on its peers: read from flags and the environment, and
enforced by a real grpc.aio server on 127.0.0.1 (health's Watch is the long call)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.common.config.flags import EnvFlags
from loraserve.common.rpc.limits import (
    ServerLimits,
    add_server_limit_flags,
    server_limits_from_args,
)
from loraserve.testing.abuse import RawPeer, call_headers, grpc_frame
from loraserve.testing.grpc import serving
from loraserve.testing.waiting import eventually

WATCH_METHOD = "/grpc.health.v1.Health/Watch"


def _parser(environ: dict[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_server_limit_flags(parser, EnvFlags(environ, "APP"))
    return parser


def test_limits_default_to_the_documented_values() -> None:
    assert server_limits_from_args(_parser({}).parse_args([])) == ServerLimits()


def test_limits_come_from_flags_before_the_environment() -> None:
    parser = _parser({"APP_MAX_CALLS": "7", "APP_STALLED_WRITE_TIMEOUT": "5"})
    limits = server_limits_from_args(parser.parse_args(["--max-calls", "9"]))
    assert limits.max_calls == 9
    assert limits.stalled_write_s == 5.0


def test_a_limit_of_zero_streams_is_refused_naming_the_flag() -> None:
    with pytest.raises(argparse.ArgumentError, match="max-streams-per-connection"):
        _parser({}).parse_args(["--max-streams-per-connection", "0"])


async def test_streams_past_the_per_connection_limit_are_refused() -> None:
    async with serving(
        lambda server: None, [], limits=ServerLimits(max_streams_per_connection=4)
    ) as running:
        peer = RawPeer(running.port)
        try:
            request = grpc_frame(health_pb2.HealthCheckRequest().SerializeToString())
            streams = [peer.open(call_headers(WATCH_METHOD), request) for _ in range(6)]

            def two_refused() -> bool:
                peer.read(0.1)
                return sum(peer.endings.get(s) == "reset" for s in streams) == 2

            await eventually(two_refused, "two streams refused")
            assert all(stream not in peer.endings for stream in streams[:4])
        finally:
            peer.close()


async def test_calls_past_the_servers_limit_end_resource_exhausted() -> None:
    async with (
        serving(lambda server: None, [], limits=ServerLimits(max_calls=3)) as running,
        grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(5)]
        try:
            outcomes = await asyncio.gather(*(_first_message_or_code(watch) for watch in watches))
        finally:
            for watch in watches:
                watch.cancel()
        assert sorted(outcomes, key=str) == sorted(
            ["SERVING"] * 3 + [grpc.StatusCode.RESOURCE_EXHAUSTED] * 2, key=str
        )


async def _first_message_or_code(watch: grpc.aio.UnaryStreamCall[Any, Any]) -> object:
    with contextlib.suppress(StopAsyncIteration):
        try:
            async for message in watch:
                return health_pb2.HealthCheckResponse.ServingStatus.Name(message.status)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return None


@pytest.mark.parametrize(
    ("accepted", "code"),
    [(False, grpc.StatusCode.UNIMPLEMENTED), (True, grpc.StatusCode.OK)],
    ids=["refused", "accepted"],
)
async def test_a_compressed_request_is_refused_unless_compressed_requests_are_accepted(
    accepted: bool, code: grpc.StatusCode
) -> None:
    limits = ServerLimits(compressed_requests=accepted)
    async with (
        serving(lambda server: None, [], limits=limits) as running,
        grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        try:
            await health.Check(health_pb2.HealthCheckRequest(), compression=grpc.Compression.Gzip)
            outcome = grpc.StatusCode.OK
        except grpc.aio.AioRpcError as exc:
            outcome = exc.code()
        assert outcome == code
        # Uncompressed, the same call is served either way.
        await health.Check(health_pb2.HealthCheckRequest())


def test_compressed_requests_are_accepted_from_the_flag_or_the_environment() -> None:
    assert not server_limits_from_args(_parser({}).parse_args([])).compressed_requests
    flagged = _parser({}).parse_args(["--accept-compressed-requests"])
    assert server_limits_from_args(flagged).compressed_requests
    from_env = _parser({"APP_ACCEPT_COMPRESSED_REQUESTS": "1"}).parse_args([])
    assert server_limits_from_args(from_env).compressed_requests
