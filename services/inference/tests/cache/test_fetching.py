"""Which path a download takes (`Fetcher`): direct reads with the store's URLs, or the
store's stream, and when it switches between them. The reads themselves, over real
HTTP, are in tests/reliability/test_direct_downloads.py."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from loraserve.common.errors import DataLoss
from loraserve.common.revisions.presigned import FileUrl, RevisionUrls, redacted
from loraserve.inference.cache import AdapterCache, FetchSettings
from loraserve.inference.settings import parse_settings
from loraserve.testing.fakes.revisions import FakeSource

BASE = ["serve", "--model", "/models/tiny", "--store", "store:50051"]
EXPIRE = datetime(2026, 1, 1, tzinfo=UTC)
URL = "https://bucket.s3.example.com/blobs/sha256/ab?X-Amz-Signature=deadbeef&X-Amz-Date=1"


@pytest.fixture
def source() -> FakeSource:
    source = FakeSource()
    source.add("alpha", 1, {"adapter_config.json": b"{}", "w.safetensors": b"x" * 3000})
    source.add("beta", 1, {"adapter_config.json": b"{}", "w.safetensors": b"y" * 3000})
    return source


async def _fetch_both(root: Path, source: FakeSource, fetch: FetchSettings) -> None:
    cache = AdapterCache(root, source, fetch=fetch)
    await cache.prepare()
    try:
        await cache.fetch("alpha", 1)
        await cache.fetch("beta", 1)
    finally:
        await cache.close()


async def test_no_urls_from_the_store_streams_for_a_while_after_one_log_line(
    tmp_path: Path, source: FakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="loraserve.inference.cache"):
        await _fetch_both(tmp_path, source, FetchSettings(retry_direct_after_s=3600))
    assert (source.url_requests, source.downloads) == (1, 2)
    assert [r.getMessage().split(" ")[0] for r in caplog.records if r.levelno >= 30] == [
        "cache.direct_off"
    ]


async def test_direct_is_tried_again_once_the_stream_period_is_over(
    tmp_path: Path, source: FakeSource
) -> None:
    await _fetch_both(tmp_path, source, FetchSettings(retry_direct_after_s=0))
    assert (source.url_requests, source.downloads) == (2, 2)


async def test_the_stream_setting_never_asks_for_urls(tmp_path: Path, source: FakeSource) -> None:
    await _fetch_both(tmp_path, source, FetchSettings(direct=False))
    assert (source.url_requests, source.downloads) == (0, 2)


def test_a_file_url_is_hidden_from_reprs_and_redacted_to_its_host() -> None:
    urls = RevisionUrls(FakeSource().add("alpha", 1, {}), (FileUrl("w", URL),), EXPIRE)
    assert "deadbeef" not in repr(urls)
    assert redacted(URL) == "https://bucket.s3.example.com"


def test_a_file_without_a_url_is_data_loss() -> None:
    urls = RevisionUrls(FakeSource().add("alpha", 1, {}), (FileUrl("w", URL),), EXPIRE)
    with pytest.raises(DataLoss, match="none for file 'x'"):
        urls.url_of("x")


def test_download_flags_fall_back_to_env_and_default_to_direct() -> None:
    default = parse_settings(BASE, {}, "host-1")
    assert (default.direct_downloads, default.download_range_size) == (True, 0)
    environ = {"INFERENCE_ADAPTER_DOWNLOAD": "stream", "INFERENCE_DOWNLOAD_RANGE_SIZE": "16MiB"}
    settings = parse_settings(BASE, environ, "host-1")
    assert (settings.direct_downloads, settings.download_range_size) == (False, 16 * 1024**2)
