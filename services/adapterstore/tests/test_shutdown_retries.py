"""Calls a store replica received but had not handed to a handler when it shut down end
CANCELLED (grpc/grpc#41785); the store clients retry them on another replica (issue 29,
item 17). Real gRPC servers on 127.0.0.1, S3 over real HTTP (moto's server)."""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.api.servicer import (
    METHOD_ROLES,
    SERVICE_NAME,
    AdapterStoreServicer,
    register,
)
from loraserve.adapterstore.blobs.s3blobs import S3BlobStore
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.clients.push import LocalFile, push
from loraserve.clients.store import store_channel
from loraserve.common.rpc.security import ClientSecurity
from loraserve.common.rpc.server import RunningServer
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.grpc import serving
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.stores import make_store, s3_location

CALLS = 12
# Long enough for the calls to cross the loopback into the first replica's gRPC core
# while its Python code cannot ask for them: they queue there, unhandled.
FREEZE_S = 0.5


@asynccontextmanager
async def _store_replica(bucket: S3Bucket) -> AsyncIterator[RunningServer]:
    store = make_store(S3BlobStore(s3_location(bucket)))
    await store.start()
    try:
        async with serving(
            register(AdapterStoreServicer(store)),
            [SERVICE_NAME],
            needs=METHOD_ROLES,
        ) as running:
            yield running
    finally:
        await store.close()


async def _stop_with_calls_queued(
    first: RunningServer, calls: Sequence[Callable[[], Awaitable[Any]]]
) -> list[BaseException | Any]:
    """Starts `calls`, holds the event loop (and so `first`'s handlers) while they
    reach `first`, then shuts `first` down with those calls still unhandled."""
    started = [asyncio.ensure_future(call()) for call in calls]
    for _ in range(5):
        await asyncio.sleep(0)
    asyncio.get_running_loop().call_soon(time.sleep, FREEZE_S)
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(first.stop(5))
    results = await asyncio.gather(*started, return_exceptions=True)
    await stopping
    return results


def _codes(results: list[BaseException | Any]) -> set[str]:
    return {r.code().name if isinstance(r, grpc.aio.AioRpcError) else "OK" for r in results}


@asynccontextmanager
async def _two_replicas(bucket: S3Bucket) -> AsyncIterator[tuple[RunningServer, Any, Any]]:
    """Two store replicas on `bucket`, and a client's stub (`store_channel`, as adapterctl
    has) to both, the first first; then a stub to the second alone."""
    async with _store_replica(bucket) as first, _store_replica(bucket) as second:
        target = f"ipv4:127.0.0.1:{first.port},127.0.0.1:{second.port}"
        async with (
            store_channel(target, ClientSecurity()) as channel,
            grpc.aio.insecure_channel(f"127.0.0.1:{second.port}") as direct,
        ):
            yield (
                first,
                pb_grpc.AdapterStoreServiceStub(channel),
                pb_grpc.AdapterStoreServiceStub(direct),
            )


@pytest.mark.slow
async def test_keyed_writes_a_stopping_store_never_handled_are_retried_on_another(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    async with _two_replicas(s3_bucket) as (first, stub, second):
        for i in range(CALLS):
            await _push_tiny(stub, f"a{i}", f"push-{i}", tmp_path / str(i))
        deletes = [
            functools.partial(
                stub.DeleteAdapter,
                pb.DeleteAdapterRequest(name=f"a{i}", idempotency_key=f"delete-{i}"),
                timeout=30,
            )
            for i in range(CALLS)
        ]
        results = await _stop_with_calls_queued(first, deletes)
        listed = await second.ListAdapters(pb.ListAdaptersRequest())
    assert _codes(results) == {"OK"}
    assert list(listed.adapters) == []


@pytest.mark.slow
async def test_pushes_a_stopping_store_never_handled_are_retried_with_their_key(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    async with _two_replicas(s3_bucket) as (first, stub, second):
        await stub.ListAdapters(pb.ListAdaptersRequest())  # connected to the first
        pushes = [
            functools.partial(_push_tiny, stub, f"p{i}", f"push-{i}", tmp_path / str(i))
            for i in range(CALLS)
        ]
        results = await _stop_with_calls_queued(first, pushes)
        listed = await second.ListAdapters(pb.ListAdaptersRequest())
    assert _codes(results) == {"OK"}
    assert sorted(a.name for a in listed.adapters) == sorted(f"p{i}" for i in range(CALLS))
    assert {a.latest_revision for a in listed.adapters} == {1}


class _Files:
    def __init__(self, files: list[LocalFile]) -> None:
        self.files = files


def _write_tiny(folder: Path) -> _Files:
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for file_name, data in tiny_adapter().items():
        (folder / file_name).write_bytes(data)
        digest = hashlib.sha256(data).hexdigest()
        files.append(LocalFile(file_name, folder / file_name, len(data), digest))
    return _Files(files)


async def _push_tiny(stub: Any, name: str, key: str, folder: Path) -> Any:
    """A push as adapterctl makes it (loraserve.clients.push), of files in `folder`."""
    return await push(
        stub,
        name,
        _write_tiny(folder),
        no_promote=False,
        description="",
        timeout_s=30,
        idempotency_key=key,
    )
