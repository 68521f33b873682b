"""Issue 24, reads: a replica's cache reads adapter bytes straight from object storage
with the presigned URLs the store hands out, and falls back to the store's stream
where it cannot.

Real parts: the store server over gRPC on moto's S3 over HTTP, the inference
service's StoreClient and AdapterCache. The store reaches S3 directly; the URLs it
signs name the fault proxy's endpoint, so every request the proxy sees is a read the
replica made itself, and a fault there hits only the direct path.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.errors import DataLoss
from loraserve.common.revisions.presigned import RevisionUrls
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.cache import AdapterCache, FetchSettings, ReadSettings
from loraserve.inference.metrics import InferenceMetrics
from loraserve.testing.adapters.files import AdapterFiles, tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore, running_store

pytestmark = pytest.mark.faults

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


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


def _client(store: RunningStore) -> CountingClient:
    settings = StoreClientSettings(store.address, ClientSecurity(), "direct-test-replica")
    return CountingClient.connect(settings)  # type: ignore[return-value]


def _key(files: AdapterFiles, name: str = WEIGHTS) -> str:
    return blob_key(hashlib.sha256(files[name]).hexdigest())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def url_store(s3_bucket: S3Bucket, fault_proxy: S3FaultProxy) -> AsyncIterator[RunningStore]:
    """A store that reaches S3 directly and signs URLs for the proxy's endpoint."""
    async with running_store(s3_bucket, download_url_endpoint=fault_proxy.endpoint_url) as store:
        yield store


async def _pushed(store: RunningStore, name: str = "alpha", seed: int = 1) -> AdapterFiles:
    files = tiny_adapter(seed=seed)
    async with store_stub(store.address) as stub:
        await push(stub, name, files)
    return files


async def _fetched(
    client: StoreClient,
    root: Path,
    names: tuple[str, ...] = ("alpha",),
    *,
    metrics: InferenceMetrics | None = None,
    fetch: FetchSettings | None = None,
) -> Path:
    """Fetches revision 1 of each name into a cache at `root` with the real AdapterCache,
    then closes the cache and the client; the cache's directory."""
    cache = AdapterCache(root, client, observer=metrics, fetch=fetch)
    await cache.prepare()
    try:
        for name in names:
            await cache.fetch(name, 1)
    finally:
        await cache.close()
        await client.close()
    return cache.root


def _on_disk(root: Path, name: str) -> dict[str, bytes]:
    path = root / name / "1"
    return {p.name: p.read_bytes() for p in path.iterdir() if not p.name.startswith(".")}


def _nothing_landed(root: Path, name: str = "alpha") -> bool:
    return not (root / name).exists() and list((root / ".tmp").iterdir()) == []


def _tamper(bucket: S3Bucket, files: AdapterFiles, at: int) -> None:
    """Flips one bit of the weights' blob in S3, behind the store's back."""
    flipped = bytearray(files[WEIGHTS])
    flipped[at] ^= 0x01
    bucket.client().put_object(Bucket=bucket.bucket, Key=_key(files), Body=bytes(flipped))


def _signatures(urls: RevisionUrls) -> list[str]:
    return [u.url.partition("X-Amz-Signature=")[2].partition("&")[0] for u in urls.urls]


async def test_replica_cache_reads_the_blobs_from_s3_not_through_the_store(
    url_store: RunningStore, fault_proxy: S3FaultProxy, tmp_path: Path
) -> None:
    files = await _pushed(url_store)
    client = _client(url_store)
    metrics = InferenceMetrics()
    root = await _fetched(client, tmp_path / "cache", metrics=metrics)
    assert _on_disk(root, "alpha") == files
    assert ("GET", _key(files)) in fault_proxy.requests
    assert ("GET", _key(files, CONFIG)) in fault_proxy.requests
    assert (client.url_requests, client.streams) == (1, 0)
    exposition = generate_latest(metrics.registry).decode()
    assert 'loraserve_inference_adapter_downloads_total{path="direct"} 1.0' in exposition


async def test_a_refused_url_is_asked_for_again_once_and_then_read_directly(
    url_store: RunningStore, fault_proxy: S3FaultProxy, tmp_path: Path
) -> None:
    files = await _pushed(url_store)
    refused = fault_proxy.add(Fault.REFUSE, "GET", _key(files), times=1)
    client = _client(url_store)
    root = await _fetched(client, tmp_path / "cache")
    assert _on_disk(root, "alpha") == files
    assert refused.hits == 1
    assert (client.url_requests, client.streams) == (2, 0)
    assert fault_proxy.requests.count(("GET", _key(files))) == 2


async def test_a_url_refused_twice_falls_back_to_the_store_stream(
    url_store: RunningStore, fault_proxy: S3FaultProxy, tmp_path: Path
) -> None:
    files = await _pushed(url_store)
    refused = fault_proxy.add(Fault.REFUSE, "GET", _key(files))
    client = _client(url_store)
    root = await _fetched(client, tmp_path / "cache")
    assert _on_disk(root, "alpha") == files
    assert refused.hits == 2
    assert (client.url_requests, client.streams) == (2, 1)


async def _two_downloads_logging_switches(
    store: RunningStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> tuple[CountingClient, list[str]]:
    """Pushes and fetches alpha and beta (each checked on disk); the client, and the
    messages of the cache's `cache.direct_off` log lines."""
    first = await _pushed(store, "alpha", seed=1)
    second = await _pushed(store, "beta", seed=2)
    client = _client(store)
    with caplog.at_level(logging.INFO, logger="loraserve.inference.cache"):
        root = await _fetched(client, tmp_path / "cache", ("alpha", "beta"))
    assert _on_disk(root, "alpha") == first
    assert _on_disk(root, "beta") == second
    messages = [r.getMessage() for r in caplog.records]
    return client, [m for m in messages if "cache.direct_off" in m]


async def test_storage_unreachable_from_the_replica_uses_the_stream_with_one_log_line(
    s3_bucket: S3Bucket, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    nowhere = f"http://127.0.0.1:{_closed_port()}"
    async with running_store(s3_bucket, download_url_endpoint=nowhere) as store:
        client, switches = await _two_downloads_logging_switches(store, tmp_path, caplog)
    # The second download streams at once: storage was found unreachable moments ago.
    assert (client.url_requests, client.streams) == (1, 2)
    assert len(switches) == 1
    assert "cannot connect to object storage" in switches[0]


async def test_a_store_that_hands_out_no_urls_sends_downloads_to_the_stream_with_one_log_line(
    s3_bucket: S3Bucket, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # `--download-url-ttl 0`, or an older store during a rolling upgrade: Unimplemented.
    async with running_store(s3_bucket, download_url_ttl_s=0) as store:
        client, switches = await _two_downloads_logging_switches(store, tmp_path, caplog)
    assert (client.url_requests, client.streams) == (1, 2)
    assert len(switches) == 1
    assert "hands out no download URLs" in switches[0]


async def test_bytes_in_s3_that_differ_from_the_manifest_are_data_loss_and_nothing_lands(
    url_store: RunningStore, fault_proxy: S3FaultProxy, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    files = await _pushed(url_store)
    _tamper(s3_bucket, files, len(files[WEIGHTS]) // 2)
    client = _client(url_store)
    with pytest.raises(DataLoss, match="sha256"):
        await _fetched(client, tmp_path / "cache")
    # Read directly, twice (the cache retries a DataLoss once), never streamed.
    assert fault_proxy.requests.count(("GET", _key(files))) == 2
    assert client.streams == 0
    assert _nothing_landed(tmp_path / "cache")


async def test_ranged_reads_of_bytes_that_differ_from_the_manifest_are_data_loss(
    url_store: RunningStore, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    files = await _pushed(url_store)
    _tamper(s3_bucket, files, -1)
    client = _client(url_store)
    fetch = FetchSettings(read=ReadSettings(range_size=len(files[WEIGHTS]) // 4))
    with pytest.raises(DataLoss, match="sha256"):
        await _fetched(client, tmp_path / "cache", fetch=fetch)
    assert client.streams == 0
    assert _nothing_landed(tmp_path / "cache")


async def test_parallel_ranged_reads_assemble_the_file_and_check_its_sha256(
    url_store: RunningStore, fault_proxy: S3FaultProxy, tmp_path: Path
) -> None:
    files = await _pushed(url_store)
    range_size = len(files[WEIGHTS]) // 5
    client = _client(url_store)
    fetch = FetchSettings(read=ReadSettings(range_size=range_size, ranges_in_flight=3))
    root = await _fetched(client, tmp_path / "cache", fetch=fetch)
    assert _on_disk(root, "alpha") == files
    # One GET per range (the last one shorter), none through the store.
    ranges = -(-len(files[WEIGHTS]) // range_size)
    assert fault_proxy.requests.count(("GET", _key(files))) == ranges
    assert (client.url_requests, client.streams) == (1, 0)


async def test_a_mixed_fleet_of_streaming_and_direct_replicas_both_get_the_revision(
    url_store: RunningStore, fault_proxy: S3FaultProxy, tmp_path: Path
) -> None:
    files = await _pushed(url_store)
    # A replica set to `--adapter-download stream` reads as replicas did before issue 24.
    streaming, direct = _client(url_store), _client(url_store)
    old = await _fetched(streaming, tmp_path / "old", fetch=FetchSettings(direct=False))
    gets_by_the_old_one = fault_proxy.requests.count(("GET", _key(files)))
    new = await _fetched(direct, tmp_path / "new")
    assert _on_disk(old, "alpha") == files
    assert _on_disk(new, "alpha") == files
    assert (streaming.url_requests, streaming.streams) == (0, 1)
    assert (direct.url_requests, direct.streams) == (1, 0)
    assert gets_by_the_old_one == 0
    assert fault_proxy.requests.count(("GET", _key(files))) == 1


async def test_a_presigned_url_never_appears_in_logs_errors_or_metrics(
    url_store: RunningStore,
    fault_proxy: S3FaultProxy,
    s3_bucket: S3Bucket,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    alpha = await _pushed(url_store, "alpha", seed=1)
    beta = await _pushed(url_store, "beta", seed=3)
    client = _client(url_store)
    signatures = _signatures(await client.download_urls("alpha", 1))
    signatures += _signatures(await client.download_urls("beta", 1))
    assert all(signatures)
    # Every path a download can take: alpha refused twice (then streamed), beta's bytes
    # differing from its manifest.
    fault_proxy.add(Fault.REFUSE, "GET", _key(alpha), times=2)
    _tamper(s3_bucket, beta, 0)
    metrics = InferenceMetrics()
    with caplog.at_level(logging.DEBUG), pytest.raises(DataLoss) as caught:
        await _fetched(client, tmp_path / "cache", ("alpha", "beta"), metrics=metrics)
    assert _on_disk(tmp_path / "cache", "alpha") == alpha
    # werkzeug's records are the S3 emulator's access log: the server side, which (as
    # S3's own access logs) holds the URLs it was sent.
    ours = [r for r in caplog.records if not r.name.startswith("werkzeug")]
    seen = "\n".join(
        [
            *(r.getMessage() for r in ours),
            str(caught.value),
            repr(caught.value.__context__),
            generate_latest(metrics.registry).decode(),
        ]
    )
    for record in ours:
        if record.exc_info and record.exc_info[1] is not None:
            seen += f"\n{record.exc_info[1]!r} {record.exc_info[1].__context__!r}"
    assert "X-Amz-Signature" not in seen
    for signature in signatures:
        assert signature not in seen
