"""A real adapter store server for tests: the gRPC servicer on 127.0.0.1, port 0,
over S3 on the moto HTTP server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import pytest

from loraserve.adapterstore.api.health import follow_freshness
from loraserve.adapterstore.api.servicer import (
    REPLICA_METHODS,
    SERVICE_NAME,
    WRITE_METHODS,
    AdapterStoreServicer,
    register,
)
from loraserve.adapterstore.blobs.presign import S3Presigner
from loraserve.adapterstore.blobs.s3blobs import S3BlobStore
from loraserve.adapterstore.files.download_urls import DownloadUrls
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.rpc.security import ServerSecurity
from loraserve.testing.adapterstore import FAST_LOG, make_store, s3_location
from loraserve.testing.grpc import serving
from loraserve.testing.s3 import S3Bucket
from loraserve.testing.s3faults import S3FaultProxy


@dataclass(frozen=True)
class RunningStore:
    """A store server a test can reach at `address`."""

    address: str
    port: int
    store: AdapterStore
    bucket: S3Bucket


@asynccontextmanager
async def running_store(
    bucket: S3Bucket,
    security: ServerSecurity | None = None,
    *,
    download_url_ttl_s: int = 300,
    download_url_endpoint: str | None = None,
    **settings: Any,
) -> AsyncIterator[RunningStore]:
    """Runs a store server on `bucket` until the block exits, its health following the
    store's freshness as `adapterstore serve` does; `settings` go to StoreSettings. It
    hands out presigned download URLs for `download_url_endpoint` (None: the bucket's
    own endpoint) valid for `download_url_ttl_s` seconds (0: none), as
    `adapterstore serve` does by default."""
    location = s3_location(bucket)
    store = make_store(S3BlobStore(location), FAST_LOG, **settings)
    await store.start()
    urls = DownloadUrls(store, S3Presigner(location, download_url_endpoint), download_url_ttl_s)
    try:
        async with serving(
            register(AdapterStoreServicer(store, urls=urls)),
            [SERVICE_NAME],
            security=security,
            write_methods=WRITE_METHODS,
            replica_methods=REPLICA_METHODS,
        ) as server:
            health = asyncio.create_task(follow_freshness(store, server.set_serving))
            try:
                yield RunningStore(f"127.0.0.1:{server.port}", server.port, store, bucket)
            finally:
                health.cancel()
                await asyncio.gather(health, return_exceptions=True)
    finally:
        await store.close()


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
async def proxied_store(s3_bucket: S3Bucket, proxy: S3FaultProxy) -> AsyncIterator[RunningStore]:
    """A store server that reaches the test's bucket only through `proxy`."""
    async with running_store(replace(s3_bucket, endpoint_url=proxy.endpoint_url)) as store:
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
