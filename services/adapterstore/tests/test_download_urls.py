"""The store's side of direct reads: which URLs it signs, for how long, and when none."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

import pytest

from loraserve.adapterstore.blobs.presign import MAX_URL_TTL_S, S3Presigner
from loraserve.adapterstore.blobs.s3blobs import S3Location
from loraserve.adapterstore.catalog.model import Adapter
from loraserve.adapterstore.files.download_urls import DownloadUrls
from loraserve.adapterstore.settings import parse_settings
from loraserve.common.errors import InvalidArgument, Unimplemented
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.revisions.presigned import FileUrl

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
    assert query["X-Amz-Expires"] == ["300"]
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
