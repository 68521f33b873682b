"""Issue 54, item 11: a replica honours its presigned URLs' `expire_time`, and a clock
skew between the store and object storage (or this replica) costs one download's
refused GETs, not every download's.

Real parts: the store server over gRPC on moto's S3 over HTTP, the inference
service's StoreClient, AdapterCache and Fetcher. The store signs URLs for the fault
proxy's endpoint, so every request the proxy sees is a read the replica made itself;
a refusal there is what object storage answers a URL it deems expired. moto checks
no URL's expiry, so a store whose clock is behind is simulated by its stated
`expire_time` only.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.catalog import now
from loraserve.adapterstore.files import download_urls
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.revisions.presigned import RevisionUrls
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.cache import AdapterCache, FetchSettings
from loraserve.inference.cache.fetching import Fetcher
from loraserve.testing.adapters.files import AdapterFiles, tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore, running_store

pytestmark = pytest.mark.faults

NAMES = ("alpha", "beta", "gamma")


class CountingClient(StoreClient):
    """The real store client, counting the URLs it asks for and the streams it opens."""

    url_requests = 0
    streams = 0

    async def download_urls(self, name: str, revision: int) -> RevisionUrls:
        self.url_requests += 1
        return await super().download_urls(name, revision)

    def download(self, name: str, revision: int):  # type: ignore[no-untyped-def]
        self.streams += 1
        return super().download(name, revision)


@pytest.fixture
async def url_store(s3_bucket: S3Bucket, fault_proxy: S3FaultProxy) -> AsyncIterator[RunningStore]:
    """A store that reaches S3 directly and signs URLs for the proxy's endpoint."""
    async with running_store(s3_bucket, download_url_endpoint=fault_proxy.endpoint_url) as store:
        yield store


@pytest.fixture
async def pushed(url_store: RunningStore) -> dict[str, AdapterFiles]:
    """alpha, beta and gamma at revision 1, each with other weights."""
    adapters = {name: tiny_adapter(seed=seed) for seed, name in enumerate(NAMES, 1)}
    async with store_stub(url_store.address) as stub:
        for name, files in adapters.items():
            await push(stub, name, files)
    return adapters


@pytest.fixture
async def client(url_store: RunningStore) -> AsyncIterator[CountingClient]:
    settings = StoreClientSettings(url_store.address, ClientSecurity(), "expiry-test-replica")
    client = CountingClient.connect(settings)
    assert isinstance(client, CountingClient)
    yield client
    await client.close()


@pytest.fixture
def store_clock_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """The store's clock an hour behind this replica's: every `expire_time` it states
    has passed when its URLs arrive (its signatures, by botocore's clock, stay valid)."""
    monkeypatch.setattr(download_urls, "now", lambda: now() - timedelta(hours=1))


def _gets(fault_proxy: S3FaultProxy, adapters: dict[str, AdapterFiles]) -> int:
    keys = {
        blob_key(hashlib.sha256(data).hexdigest())
        for files in adapters.values()
        for data in files.values()
    }
    return sum(1 for method, key in fault_proxy.requests if method == "GET" and key in keys)


async def _fetch_all(client: StoreClient, root: Path) -> Path:
    cache = AdapterCache(root, client, fetch=FetchSettings(retry_direct_after_s=3600))
    await cache.prepare()
    try:
        for name in NAMES:
            await cache.fetch(name, 1)
    finally:
        await cache.close()
    return cache.root


def _on_disk(root: Path, name: str) -> AdapterFiles:
    path = root / name / "1"
    return {p.name: p.read_bytes() for p in path.iterdir() if not p.name.startswith(".")}


@pytest.mark.usefixtures("store_clock_behind")
async def test_urls_that_arrive_expired_are_never_used_and_downloads_stream(
    pushed: dict[str, AdapterFiles],
    client: CountingClient,
    fault_proxy: S3FaultProxy,
    tmp_path: Path,
) -> None:
    root = await _fetch_all(client, tmp_path / "cache")
    assert {name: _on_disk(root, name) for name in NAMES} == pushed
    assert _gets(fault_proxy, pushed) == 0
    assert (client.url_requests, client.streams) == (1, len(NAMES))


async def test_urls_refused_although_unexpired_cost_one_download_two_gets_not_every_download(
    pushed: dict[str, AdapterFiles],
    client: CountingClient,
    fault_proxy: S3FaultProxy,
    tmp_path: Path,
) -> None:
    # Storage refuses every URL the store signs: their clocks are far apart.
    rules = [
        fault_proxy.add(Fault.REFUSE, "GET", blob_key(hashlib.sha256(data).hexdigest()))
        for files in pushed.values()
        for data in files.values()
    ]
    root = await _fetch_all(client, tmp_path / "cache")
    assert {name: _on_disk(root, name) for name in NAMES} == pushed
    assert sum(rule.hits for rule in rules) == 2
    assert (client.url_requests, client.streams) == (2, len(NAMES))


async def test_urls_about_to_expire_are_renewed_before_the_next_file(
    pushed: dict[str, AdapterFiles],
    client: CountingClient,
    fault_proxy: S3FaultProxy,
    tmp_path: Path,
) -> None:
    # An hour passes with every GET: the URLs have expired by the second file.
    fetcher = Fetcher(client, FetchSettings(), clock=lambda: 3600.0 * _gets(fault_proxy, pushed))
    manifest = await client.get_revision("alpha", 1)
    staging = tmp_path / "staging"
    staging.mkdir()
    try:
        await fetcher.fetch(manifest, staging)
    finally:
        await fetcher.close()
    assert {p.name: p.read_bytes() for p in staging.iterdir()} == pushed["alpha"]
    assert len(pushed["alpha"]) == 2
    assert (client.url_requests, client.streams, _gets(fault_proxy, pushed)) == (2, 0, 2)
