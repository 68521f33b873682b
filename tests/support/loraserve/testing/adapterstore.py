"""Test support for the adapter store: store fixtures, and a store served over gRPC on S3."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.api.servicer import (
    REPLICA_METHODS,
    SERVICE_NAME,
    WRITE_METHODS,
    AdapterStoreServicer,
    register,
)
from loraserve.adapterstore.blobs.blobstore import BlobStore
from loraserve.adapterstore.blobs.presign import S3Presigner
from loraserve.adapterstore.blobs.s3blobs import MIN_PART_SIZE, S3BlobStore, S3Location
from loraserve.adapterstore.changelog.log import ChangeLog, LogSettings
from loraserve.adapterstore.files.download_urls import DownloadUrls
from loraserve.adapterstore.files.validation import Limits
from loraserve.adapterstore.replicas.model import DEFAULT_STATUS_TTL_S
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.adapterstore.store import AdapterStore, StoreSettings
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.testing.grpc import serving
from loraserve.testing.memblobs import MemoryBlobStore
from loraserve.testing.s3 import S3Bucket

FAST_LOG = LogSettings(poll_interval=0.05, snapshot_every=100, log_retention=0)
TEST_LIMITS = Limits(max_file_size=64 * 1024 * 1024, max_adapter_size=128 * 1024 * 1024)


def make_store(
    blobs: BlobStore, log_settings: LogSettings = FAST_LOG, **kwargs: Any
) -> AdapterStore:
    statuses = ReplicaStatusStore(blobs, kwargs.pop("status_ttl_s", DEFAULT_STATUS_TTL_S))
    settings = StoreSettings(limits=kwargs.pop("limits", TEST_LIMITS), **kwargs)
    return AdapterStore(blobs, ChangeLog(blobs, log_settings), statuses, settings)


StoreFactory = Callable[..., Awaitable[AdapterStore]]


@pytest.fixture
async def open_store() -> AsyncIterator[StoreFactory]:
    """Starts stores on given blob stores and closes them after the test."""
    stores: list[AdapterStore] = []

    async def start(
        blobs: BlobStore, log_settings: LogSettings = FAST_LOG, **kwargs: Any
    ) -> AdapterStore:
        store = make_store(blobs, log_settings, **kwargs)
        await store.start()
        stores.append(store)
        return store

    yield start
    for store in stores:
        await store.close()


@pytest.fixture
def memory_blobs() -> MemoryBlobStore:
    return MemoryBlobStore()


@pytest.fixture
async def memory_store(memory_blobs: MemoryBlobStore, open_store: StoreFactory) -> AdapterStore:
    return await open_store(memory_blobs)


def s3_location(bucket: S3Bucket, prefix: str = "") -> S3Location:
    return S3Location(
        bucket=bucket.bucket,
        prefix=prefix,
        endpoint_url=bucket.endpoint_url,
        region=bucket.region,
        access_key_id=bucket.access_key_id,
        secret_access_key=bucket.secret_access_key,
    )


@dataclass
class StoreServer:
    """A store served over gRPC on a loopback port, with a client stub."""

    store: AdapterStore
    address: str
    stub: pb_grpc.AdapterStoreServiceStub


@asynccontextmanager
async def serve_store(
    bucket: S3Bucket,
    log_settings: LogSettings = FAST_LOG,
    principal: Callable[[], str] = lambda: "tester",
    *,
    download_url_ttl_s: int = 300,
    download_url_endpoint: str | None = None,
    **kwargs: Any,
) -> AsyncIterator[StoreServer]:
    """Runs a store on the bucket over real S3 HTTP and real gRPC, until the block exits.
    It hands out presigned download URLs for `download_url_endpoint` (None: the
    bucket's own endpoint) valid for `download_url_ttl_s` seconds (0: none)."""
    location = s3_location(bucket)
    store = make_store(S3BlobStore(location, part_size=MIN_PART_SIZE), log_settings, **kwargs)
    await store.start()
    try:
        signer = S3Presigner(location, download_url_endpoint)
        urls = DownloadUrls(store, signer, download_url_ttl_s)
        servicer = AdapterStoreServicer(store, principal, urls)
        async with serving(
            register(servicer),
            [SERVICE_NAME],
            write_methods=WRITE_METHODS,
            replica_methods=REPLICA_METHODS,
        ) as running:
            address = f"127.0.0.1:{running.port}"
            async with grpc.aio.insecure_channel(address) as channel:
                yield StoreServer(store, address, pb_grpc.AdapterStoreServiceStub(channel))
    finally:
        await store.close()
