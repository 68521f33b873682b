"""Adapter stores for tests, in process on any blob store (fixtures for the in-memory one),
and the S3 location of a test bucket."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from loraserve.adapterstore.blobs.blobstore import BlobStore
from loraserve.adapterstore.blobs.s3blobs import S3Location
from loraserve.adapterstore.changelog.log import ChangeLog, LogSettings
from loraserve.adapterstore.files.validation import Limits
from loraserve.adapterstore.replicas.model import DEFAULT_STATUS_TTL_S
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.adapterstore.store import AdapterStore, StoreSettings
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.s3.endpoint import S3Bucket

FAST_LOG = LogSettings(poll_interval=0.05, snapshot_every=100, log_retention=0)
TEST_LIMITS = Limits(max_file_size=64 * 1024 * 1024, max_adapter_size=128 * 1024 * 1024)


def make_store(
    blobs: BlobStore, log_settings: LogSettings = FAST_LOG, **kwargs: Any
) -> AdapterStore:
    """`storage_format` (a callable) says which format its snapshots are written in
    (format 1, what 0.1.0 reads, unless given)."""
    statuses = ReplicaStatusStore(blobs, kwargs.pop("status_ttl_s", DEFAULT_STATUS_TTL_S))
    changelog = ChangeLog(blobs, log_settings, kwargs.pop("storage_format", lambda: 1))
    settings = StoreSettings(limits=kwargs.pop("limits", TEST_LIMITS), **kwargs)
    return AdapterStore(blobs, changelog, statuses, settings)


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
