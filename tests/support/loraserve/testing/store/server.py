"""A real adapter store server for tests: the gRPC servicer on 127.0.0.1, port 0,
over S3 on the moto HTTP server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.api.health import follow_freshness
from loraserve.adapterstore.api.servicer import (
    METHOD_ROLES,
    SERVICE_NAME,
    AdapterStoreServicer,
    register,
)
from loraserve.adapterstore.blobs.presign import S3Presigner
from loraserve.adapterstore.blobs.s3blobs import DEFAULT_PART_SIZE, MIN_PART_SIZE, S3BlobStore
from loraserve.adapterstore.changelog.log import LogSettings
from loraserve.adapterstore.files.download_urls import DownloadUrls
from loraserve.adapterstore.store import AdapterStore
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.limits import ServerLimits
from loraserve.common.rpc.security import ServerSecurity, current_principal
from loraserve.testing.grpc import serving
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import S3FaultProxy
from loraserve.testing.store.stores import FAST_LOG, make_store, s3_location


@dataclass(frozen=True)
class RunningStore:
    """A store server a test can reach at `address`."""

    address: str
    port: int
    store: AdapterStore
    bucket: S3Bucket


@dataclass(frozen=True)
class StoreServer(RunningStore):
    """A store server with a client stub on an insecure channel to it."""

    stub: pb_grpc.AdapterStoreServiceStub


@asynccontextmanager
async def running_store(
    bucket: S3Bucket,
    security: ServerSecurity | None = None,
    *,
    log_settings: LogSettings = FAST_LOG,
    principal: Callable[[], str] = current_principal.get,
    part_size: int = DEFAULT_PART_SIZE,
    download_url_ttl_s: int = 300,
    download_url_endpoint: str | None = None,
    server_limits: ServerLimits | None = None,
    **settings: Any,
) -> AsyncIterator[RunningStore]:
    """Runs a store server on `bucket` until the block exits, its health following the
    store's freshness as `adapterstore serve` does; `settings` go to StoreSettings. It
    hands out presigned download URLs for `download_url_endpoint` (None: the bucket's
    own endpoint) valid for `download_url_ttl_s` seconds (0: none), as
    `adapterstore serve` does by default; `server_limits` bound its peers (the defaults without)."""
    location = s3_location(bucket)
    store = make_store(S3BlobStore(location, part_size=part_size), log_settings, **settings)
    await store.start()
    urls = DownloadUrls(store, S3Presigner(location, download_url_endpoint), download_url_ttl_s)
    try:
        async with serving(
            register(AdapterStoreServicer(store, principal, urls)),
            [SERVICE_NAME],
            security=security,
            needs=METHOD_ROLES,
            limits=server_limits,
        ) as server:
            health = asyncio.create_task(follow_freshness(store, server.set_serving))
            try:
                yield RunningStore(f"127.0.0.1:{server.port}", server.port, store, bucket)
            finally:
                health.cancel()
                await asyncio.gather(health, return_exceptions=True)
    finally:
        await store.close()


@asynccontextmanager
async def serve_store(
    bucket: S3Bucket,
    log_settings: LogSettings = FAST_LOG,
    principal: Callable[[], str] = lambda: "tester",
    **settings: Any,
) -> AsyncIterator[StoreServer]:
    """`running_store` with the smallest multipart part S3 takes (so a few MiB make
    several parts), calls made as `principal`, and a stub to call it with."""
    async with (
        running_store(
            bucket,
            log_settings=log_settings,
            principal=principal,
            part_size=MIN_PART_SIZE,
            **settings,
        ) as running,
        grpc.aio.insecure_channel(running.address) as channel,
    ):
        stub = pb_grpc.AdapterStoreServiceStub(channel)
        yield StoreServer(running.address, running.port, running.store, running.bucket, stub)


@pytest.fixture
async def store_server(s3_bucket: S3Bucket) -> AsyncIterator[RunningStore]:
    """A store server with authentication off, on a fresh bucket."""
    async with running_store(s3_bucket) as running:
        yield running


@pytest.fixture(scope="module")
async def module_store_server(module_s3_bucket: S3Bucket) -> AsyncIterator[RunningStore]:
    """A store server with authentication off, shared by one module's tests (see
    `module_s3_bucket`): one start-up instead of one per test."""
    async with running_store(module_s3_bucket) as running:
        yield running


@pytest.fixture
async def proxied_store(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy
) -> AsyncIterator[RunningStore]:
    """A store server that reaches the test's bucket only through `fault_proxy`."""
    async with running_store(replace(s3_bucket, endpoint_url=fault_proxy.endpoint_url)) as store:
        yield store


def stored_objects(store: RunningStore) -> list[str]:
    """Every blob, log entry and upload in the store's bucket (what a refused push must
    not leave)."""
    client = store.bucket.client()
    listing = client.list_objects_v2(Bucket=store.bucket.bucket)
    return sorted(
        o["Key"]
        for o in listing.get("Contents", [])
        if o["Key"].startswith(("blobs/", "log/", "tmp/"))
    )
