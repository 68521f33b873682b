"""The adapter store's port survives peers that misbehave on purpose: a push body from a
caller with no token is refused before it is read, a download its client never reads is
ended by the stalled-write clock, and idle connections are closed by the handshake
clock, while a normal client still pushes and downloads. The store runs with tokens and
both clocks shortened, over S3 on real HTTP."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.common.rpc.limits import ServerLimits
from loraserve.common.rpc.security import ServerSecurity, Token
from loraserve.testing.abuse import (
    RawPeer,
    call_headers,
    closed_by_server,
    grpc_frame,
    unfinished_bodies_without_a_token,
)
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.inference.app import adapter_files
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.waiting import eventually

READER, WRITER = "abuse-reader", "abuse-writer"
STALLED_WRITE_S = 2
HANDSHAKE_S = 2
RSS_BOUND = 64 * 1024 * 1024
SERVICE = "/loraserve.adapterstore.v1.AdapterStoreService"
DOWNLOAD_METHOD = f"{SERVICE}/DownloadAdapter"


def _auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
async def store(s3_bucket: S3Bucket) -> AsyncIterator[RunningStore]:
    security = ServerSecurity(
        reader_tokens=(Token("reader", READER),), writer_tokens=(Token("writer", WRITER),)
    )
    limits = ServerLimits(stalled_write_s=STALLED_WRITE_S, handshake_timeout_s=HANDSHAKE_S)
    async with running_store(s3_bucket, security, server_limits=limits) as running:
        yield running


async def _pushes_and_downloads(store: RunningStore, tiny_adapter: TinyAdapterFactory) -> None:
    """A well-behaved client pushes an adapter and downloads every byte of it."""
    files = adapter_files(tiny_adapter(seed=3))
    async with grpc.aio.insecure_channel(store.address) as channel:
        stub = pb_grpc.AdapterStoreServiceStub(channel)
        await stream_unary(
            stub.PushAdapter, push_requests("normal", files), metadata=_auth(WRITER), timeout=60
        )
        received = 0
        download = stub.DownloadAdapter(
            pb.DownloadAdapterRequest(name="normal"), metadata=_auth(READER), timeout=60
        )
        async for message in download:
            received += len(message.chunk.data)
    assert received == sum(len(data) for data in files.values())


# A streamed request is read only as the handler asks; a unary one is read whole before
# the handler runs, unless the call is refused when its HEADERS arrive.
@pytest.mark.parametrize("method", ["PushAdapter", "GetAdapter"])
async def test_bodies_without_a_token_are_refused_before_they_are_read(
    store: RunningStore, tiny_adapter: TinyAdapterFactory, method: str
) -> None:
    growth = await unfinished_bodies_without_a_token(
        store.port, f"{SERVICE}/{method}", lambda: _pushes_and_downloads(store, tiny_adapter)
    )
    assert growth < RSS_BOUND


async def test_a_download_its_client_never_reads_is_ended_by_the_stalled_write_clock(
    store: RunningStore, tiny_adapter: TinyAdapterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    await _pushes_and_downloads(store, tiny_adapter)
    caplog.set_level(logging.INFO, logger="loraserve.common.rpc.grpcutil")
    peer = RawPeer(store.port, initial_window=0)
    try:
        request = grpc_frame(pb.DownloadAdapterRequest(name="normal").SerializeToString())
        for _ in range(10):
            peer.open(call_headers(DOWNLOAD_METHOD, READER), request)

        async def every_download_ended() -> bool:
            # Reading answers the server's pings and SETTINGS, as a live client does.
            assert await asyncio.to_thread(peer.read, 0.05)
            ended = [
                record
                for record in caplog.records
                if record.getMessage().startswith(f"rpc.error method={DOWNLOAD_METHOD} ")
                and "code=RESOURCE_EXHAUSTED" in record.getMessage()
                and "read none of the response" in record.getMessage()
            ]
            return len(ended) >= 10

        await eventually(every_download_ended, "every download ended")
        await _pushes_and_downloads(store, tiny_adapter)
    finally:
        peer.close()


async def test_idle_connections_hold_no_client_out_and_are_closed_after_the_handshake_timeout(
    store: RunningStore, tiny_adapter: TinyAdapterFactory
) -> None:
    idle = [socket.create_connection(("127.0.0.1", store.port)) for _ in range(1000)]
    try:
        await _pushes_and_downloads(store, tiny_adapter)
        await eventually(
            lambda: all(closed_by_server(sock) for sock in idle), "every idle one closed"
        )
    finally:
        for sock in idle:
            sock.close()
