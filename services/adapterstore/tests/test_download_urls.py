"""The store's side of direct reads: which URLs it signs, for how long, and when none."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest

from loraserve.adapterstore.blobs.presign import MAX_URL_TTL_S, S3Presigner
from loraserve.adapterstore.blobs.s3blobs import S3Location
from loraserve.adapterstore.catalog.model import Adapter
from loraserve.adapterstore.files.download_urls import (
    DEFAULT_URL_MIN_RATE,
    URL_TTL_MARGIN_S,
    DownloadUrls,
    url_ttl_s,
)
from loraserve.adapterstore.settings import parse_settings
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.errors import InvalidArgument, Unimplemented
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.revisions.presigned import FileUrl
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, Token, secure_channel
from loraserve.testing.adapters.files import AdapterFiles, tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import running_store

MIB = 1024 * 1024

LOCATION = S3Location(
    bucket="adapters",
    prefix="team-a",
    endpoint_url="http://s3.internal:9000",
    region="us-east-1",
    access_key_id="store-key",
    secret_access_key="store-secret",
)
SHA = "ab" * 32
MANIFEST = Revision(
    adapter_name="alpha",
    revision=3,
    files=(FileInfo("adapter_config.json", 2, SHA), FileInfo("w.safetensors", 10, "cd" * 32)),
    base_model="tiny",
    rank=8,
    alpha=16.0,
    target_modules=("q_proj",),
    create_time=datetime(2026, 1, 1, tzinfo=UTC),
    pushed_by="test",
    description="",
    seq=3,
)


class OneRevision:
    async def get(self, name: str, revision: int = 0) -> tuple[Adapter, Revision]:
        return None, MANIFEST  # type: ignore[return-value]


async def test_urls_are_sigv4_for_the_replicas_endpoint_and_each_files_blob() -> None:
    signer = S3Presigner(LOCATION, "https://s3.replicas.example")
    urls = await DownloadUrls(OneRevision(), signer, 300).revision_urls("alpha", 3)
    assert [u.name for u in urls.urls] == ["adapter_config.json", "w.safetensors"]
    first = urlsplit(urls.urls[0].url)
    assert (first.scheme, first.netloc) == ("https", "s3.replicas.example")
    assert first.path == f"/adapters/team-a/blobs/sha256/{SHA}"
    query = parse_qs(first.query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert query["X-Amz-Expires"] == [str(URL_TTL_MARGIN_S + 1)]
    assert "store-secret" not in urls.urls[0].url
    assert urls.manifest == MANIFEST


async def test_a_ttl_of_zero_hands_out_no_urls() -> None:
    urls = DownloadUrls(OneRevision(), S3Presigner(LOCATION), 0)
    with pytest.raises(Unimplemented, match="DownloadAdapter"):
        await urls.revision_urls("alpha", 3)


def test_a_file_url_repr_hides_the_url() -> None:
    assert "secret" not in repr(FileUrl("w", "https://h/k?X-Amz-Signature=secret"))


@pytest.mark.parametrize("ttl", [0, MAX_URL_TTL_S + 1])
def test_a_signer_refuses_a_ttl_out_of_bounds(ttl: int) -> None:
    with pytest.raises(ValueError, match="expires_s"):
        S3Presigner(LOCATION).presign_get("blobs/x", ttl)


def test_url_flags_fall_back_to_env_and_a_ttl_over_the_bound_is_refused() -> None:
    environ = {
        "ADAPTERSTORE_BUCKET": "adapters",
        "ADAPTERSTORE_DOWNLOAD_URL_TTL": "60",
        "ADAPTERSTORE_DOWNLOAD_URL_ENDPOINT": "https://s3.replicas.example",
    }
    settings = parse_settings(["serve"], environ)
    assert settings.download_url_ttl_s == 60
    assert settings.download_url_endpoint == "https://s3.replicas.example"
    assert parse_settings(["serve", "--bucket", "b"], {}).download_url_ttl_s == 300
    with pytest.raises(InvalidArgument, match="--download-url-ttl"):
        parse_settings(["serve", "--bucket", "b", "--download-url-ttl", "3601"], {})


@pytest.mark.parametrize(
    ("size", "max_ttl_s", "ttl_s"),
    [
        (0, 300, URL_TTL_MARGIN_S),
        (100 * DEFAULT_URL_MIN_RATE, 300, URL_TTL_MARGIN_S + 100),
        (100 * DEFAULT_URL_MIN_RATE + 1, 300, URL_TTL_MARGIN_S + 101),
        (10 * 1024 * MIB, 300, 300),
        (0, 10, 10),
    ],
)
def test_url_lifetime_is_the_margin_plus_the_read_at_the_floor_rate_capped(
    size: int, max_ttl_s: int, ttl_s: int
) -> None:
    assert url_ttl_s(size, max_ttl_s, DEFAULT_URL_MIN_RATE) == ttl_s


async def _urls_asked_by_a_reader(
    bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> tuple[AdapterFiles, pb.GetDownloadUrlsResponse]:
    """alpha@1 pushed (a tiny adapter) to a real store that wants tokens, and its URLs
    as the reader `replica-7` asked for them, with the store's log captured."""
    security = ServerSecurity(
        reader_tokens=(Token("replica-7", "r-token"),), writer_tokens=(Token("ci", "w-token"),)
    )
    files = tiny_adapter()
    async with running_store(bucket, security=security) as store:
        async with secure_channel(store.address, ClientSecurity(token="w-token")) as channel:
            await push(pb_grpc.AdapterStoreServiceStub(channel), "alpha", files)
        async with secure_channel(store.address, ClientSecurity(token="r-token")) as channel:
            stub = pb_grpc.AdapterStoreServiceStub(channel)
            with caplog.at_level(logging.INFO, logger="loraserve.adapterstore.files"):
                answer = await stub.GetDownloadUrls(pb.GetDownloadUrlsRequest(name="alpha"))
    return files, answer


async def test_a_small_adapters_urls_live_only_for_the_margin(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    files, answer = await _urls_asked_by_a_reader(s3_bucket, caplog)
    assert sum(len(data) for data in files.values()) < DEFAULT_URL_MIN_RATE
    expires = {parse_qs(urlsplit(u.url).query)["X-Amz-Expires"][0] for u in answer.urls}
    assert expires == {str(URL_TTL_MARGIN_S + 1)}


async def test_each_issue_of_urls_is_logged_with_the_caller_revision_and_lifetime(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    files, _ = await _urls_asked_by_a_reader(s3_bucket, caplog)
    issued = [r.getMessage() for r in caplog.records if "download_urls_issued" in r.getMessage()]
    size = sum(len(data) for data in files.values())
    assert issued == [
        f"store.download_urls_issued principal=replica-7 name=alpha rev=1 files={len(files)} "
        f"bytes={size} ttl_s={URL_TTL_MARGIN_S + 1}"
    ]


def test_the_url_floor_rate_flag_falls_back_to_env_and_must_be_positive() -> None:
    assert parse_settings(["serve", "--bucket", "b"], {}).download_url_min_rate == 2 * MIB
    environ = {"ADAPTERSTORE_BUCKET": "b", "ADAPTERSTORE_DOWNLOAD_URL_MIN_RATE": "512KiB"}
    assert parse_settings(["serve"], environ).download_url_min_rate == 512 * 1024
    with pytest.raises(InvalidArgument, match="--download-url-min-rate"):
        parse_settings(["serve", "--bucket", "b", "--download-url-min-rate", "0"], {})
