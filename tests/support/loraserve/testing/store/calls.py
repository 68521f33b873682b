"""Short-hand for tests that drive an adapter store over real gRPC."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.pushes import push_requests


@asynccontextmanager
async def store_stub(address: str, channel: grpc.aio.Channel | None = None) -> AsyncIterator[Any]:
    """An AdapterStoreService stub on a fresh insecure channel (or on `channel`)."""
    if channel is not None:
        yield pb_grpc.AdapterStoreServiceStub(channel)
        return
    async with grpc.aio.insecure_channel(address) as own:
        yield pb_grpc.AdapterStoreServiceStub(own)


async def push(stub: Any, name: str, files: AdapterFiles, **header: Any) -> pb.PushAdapterResponse:
    response: pb.PushAdapterResponse = await stream_unary(
        stub.PushAdapter, push_requests(name, files, **header), timeout=60
    )
    return response


async def rpc_code(call: Any) -> grpc.StatusCode:
    """The status code an awaitable gRPC call ends with (OK when it succeeds)."""
    try:
        await call
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def first_watch_messages(
    stub: Any, after_seq: int, count: int
) -> list[pb.WatchAdaptersResponse]:
    """The first `count` messages of a watch from `after_seq`."""
    call = stub.WatchAdapters(pb.WatchAdaptersRequest(after_seq=after_seq), timeout=30)
    messages: list[pb.WatchAdaptersResponse] = []
    try:
        async for message in call:
            messages.append(message)
            if len(messages) == count:
                break
    finally:
        call.cancel()
    return messages


def revision_numbers(listing: pb.ListRevisionsResponse) -> list[int]:
    return [r.revision for r in listing.revisions]


def keys_under(keys: Iterable[str], prefix: str) -> list[str]:
    return [k for k in keys if k.startswith(prefix)]
