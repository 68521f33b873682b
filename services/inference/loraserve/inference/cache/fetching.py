"""How a revision's bytes reach the staging directory: straight from object storage
with presigned URLs the store hands out (`direct`), or through the store's
`DownloadAdapter` stream (`stream`).

Direct is the default: the store only signs, so its CPU and network stay out of the
data path, and the replica needs no storage credentials. The stream is used instead:
- when the settings say so (`--adapter-download stream`);
- when the store hands out no URLs (Unimplemented: an older store during a rolling
  upgrade, or `--download-url-ttl 0`);
- when object storage cannot be reached from here (no connection could be made);
- when the URLs arrive expired, or about to, by this replica's clock (`expire_time`:
  the store's clock is behind; a GET would be refused);
- when storage refuses the URLs twice (new ones are asked for once: they may have
  expired unseen, if this replica's clock is behind the store's; refused again, the
  store's clock and storage's disagree, or the URLs were altered);
- when a direct read fails otherwise (a cut transfer, a 5xx, a missing object): the
  stream gets this one download, and the store reports what it finds.
All but the last send every download to the stream for `retry_direct_after_s` before
direct is tried again, so a clock skew costs one download's refused GETs, not every
download's; each change between the two paths is one log line. URLs that will expire
within `URL_LEAD_S` are renewed before a file is read (a revision read slower than the
store expected). Bytes that differ from the manifest are DataLoss on either path and
never retried on the other (the cache retries a DataLoss once itself).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from opentelemetry.trace import Span

from loraserve.clients.downloads import FileChunk
from loraserve.common.errors import DataLoss, Unimplemented
from loraserve.common.revisions.manifest import Revision
from loraserve.common.revisions.presigned import RevisionUrls
from loraserve.common.tracing import child_span, tracer
from loraserve.inference.cache.download import (
    check_manifest,
    receive_revision,
    same_files,
    write_empty,
)
from loraserve.inference.cache.http_read import (
    HttpReader,
    ReadFailed,
    ReadSettings,
    StorageUnreachable,
    UrlRefused,
)

log = logging.getLogger(__name__)
_TRACER = tracer(__name__)

DIRECT = "direct"
STREAM = "stream"
# Seconds a URL must still have before a GET with it starts: the connection, and the
# ranges of a file that start after the first, reach storage before it expires.
URL_LEAD_S = 5.0


class DownloadSource(Protocol):
    """Where a revision's bytes come from: the store client, or a fake in tests."""

    def download(self, name: str, revision: int) -> AsyncGenerator[Revision | FileChunk, None]:
        """The manifest first, then each file's chunks in manifest order."""

    async def download_urls(self, name: str, revision: int) -> RevisionUrls:
        """The manifest and presigned URLs of its files; Unimplemented if none."""
        ...


@dataclass(frozen=True)
class FetchSettings:
    """Which path downloads take (see the module's docstring)."""

    # False: always the store's stream (`--adapter-download stream`).
    direct: bool = True
    # Seconds downloads stream after direct reads proved impossible, before trying again.
    retry_direct_after_s: float = 60.0
    read: ReadSettings = field(default_factory=ReadSettings)


class _Fallback(Exception):
    """This download goes through the stream; `reason` says why (never a URL)."""

    def __init__(self, reason: str, *, for_a_while: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.for_a_while = for_a_while


@dataclass(frozen=True)
class _Urls:
    """URLs from the store and the `clock` time until which a GET may start with them."""

    urls: RevisionUrls
    usable_until: float


class Fetcher:
    """Fills a staging directory with a revision's verified files, by either path.
    `clock` (monotonic seconds) times URLs and the stream periods."""

    def __init__(
        self,
        source: DownloadSource,
        settings: FetchSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._settings = settings
        self._reader = HttpReader(settings.read)
        self._clock = clock
        # Until this clock time every download streams; -inf: direct is on.
        self._streaming_until = float("-inf") if settings.direct else float("inf")

    async def close(self) -> None:
        await self._reader.close()

    async def fetch(self, expected: Revision, staging: Path) -> tuple[Revision, str]:
        """The manifest of the revision now in `staging`, and the path it took."""
        if self._clock() < self._streaming_until:
            return await self._stream(expected, staging), STREAM
        try:
            manifest = await self._direct(expected, staging)
        except _Fallback as fallback:
            self._fall_back(expected, fallback)
            await asyncio.to_thread(_empty, staging)
            return await self._stream(expected, staging), STREAM
        if self._streaming_until != float("-inf"):
            log.info("cache.direct_restored: downloads read object storage directly again")
            self._streaming_until = float("-inf")
        return manifest, DIRECT

    def _fall_back(self, expected: Revision, fallback: _Fallback) -> None:
        name, revision = expected.adapter_name, expected.revision
        if not fallback.for_a_while:
            log.warning(
                "cache.direct_failed name=%s rev=%d reason=%s: streaming this download "
                "through the store",
                name,
                revision,
                fallback.reason,
            )
            return
        wait = self._settings.retry_direct_after_s
        self._streaming_until = self._clock() + wait
        log.warning(
            "cache.direct_off name=%s rev=%d reason=%s: downloads stream through the store for %gs",
            name,
            revision,
            fallback.reason,
            wait,
        )

    async def _stream(self, expected: Revision, staging: Path) -> Revision:
        stream = self._source.download(expected.adapter_name, expected.revision)
        return await receive_revision(stream, expected, staging)

    async def _direct(self, expected: Revision, staging: Path) -> Revision:
        urls = await self._urls(expected)
        asked_again = False
        for file in urls.urls.manifest.files:
            if file.size == 0:
                await asyncio.to_thread(write_empty, staging, file)
                continue
            while True:
                if self._clock() >= urls.usable_until:
                    log.info(
                        "cache.urls_renewed name=%s rev=%d: the store's URLs are about to expire",
                        expected.adapter_name,
                        expected.revision,
                    )
                    urls = await self._urls(expected)
                try:
                    await self._reader.read(urls.urls.url_of(file.name), file, staging)
                    break
                except UrlRefused as exc:
                    await asyncio.to_thread(_remove, staging / file.name)
                    if asked_again:
                        # Fresh URLs refused too: the store's clock and storage's disagree
                        # (or something alters URLs); the next downloads would pay the same.
                        raise _Fallback(f"{exc} (twice)", for_a_while=True) from None
                    asked_again = True
                    log.info("cache.urls_refused: %s; asking the store again", exc)
                    urls = await self._urls(expected)
                except StorageUnreachable as exc:
                    raise _Fallback(str(exc), for_a_while=True) from None
                except ReadFailed as exc:
                    raise _Fallback(str(exc), for_a_while=False) from None
        return urls.urls.manifest

    async def _urls(self, expected: Revision) -> _Urls:
        name, revision = expected.adapter_name, expected.revision
        try:
            # The store's call carries this span's context: its own span is a child.
            with child_span(_TRACER, "loraserve.replica.download_urls"):
                urls = await self._source.download_urls(name, revision)
        except Unimplemented as exc:
            raise _Fallback(
                f"the store hands out no download URLs ({exc.message})", for_a_while=True
            ) from None
        check_manifest(urls.manifest, name, revision)
        if not same_files(urls.manifest, expected):
            raise DataLoss(
                f"download of {name}@{revision}: the store's URLs list other files than "
                "its event or listing"
            )
        # Measured once against this replica's wall clock, then counted on `clock`.
        left = (urls.expire_time - datetime.now(UTC)).total_seconds() - URL_LEAD_S
        if left <= 0:
            raise _Fallback(
                f"the store's URLs arrive with {left + URL_LEAD_S:.0f} s left by this "
                f"replica's clock, under {URL_LEAD_S:g} s: the store's clock is behind "
                "(or its --download-url-ttl is a few seconds)",
                for_a_while=True,
            )
        return _Urls(urls, self._clock() + left)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def _empty(staging: Path) -> None:
    """Removes what a direct attempt left, so the stream starts afresh."""
    for entry in staging.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def describe_download(span: Span, manifest: Revision, path: str) -> None:
    """What a download span fetched: the revision, its files and bytes (each file's
    SHA-256 checked as it arrived), and the path they took (`direct` or `stream`)."""
    if span.is_recording():
        span.set_attributes(
            {
                "loraserve.adapter": manifest.adapter_name,
                "loraserve.revision": manifest.revision,
                "loraserve.files": len(manifest.files),
                "loraserve.bytes": sum(f.size for f in manifest.files),
                "loraserve.download.path": path,
            }
        )
