"""Reading one file of a revision from object storage with a presigned URL.

A file is one streamed GET, written and hashed as it arrives (`FileWriter`, as the
store's stream is), or, when it is at least two `range_size`s long and ranges are on,
parallel ranged GETs written at their offsets and hashed once all have landed. Either
way a size or SHA-256 that differs from the manifest is DataLoss.

What can go wrong is told apart, since each asks for something else
(`loraserve.inference.cache.fetching` decides): `UrlRefused` (HTTP 400/401/403: the
URL expired or was altered; new URLs may work), `StorageUnreachable` (no connection
could be made: the replica cannot reach object storage), `ReadFailed` (anything
else: a cut transfer, a 5xx, a missing object). A URL is a credential: no message
here holds one, only the file's name and the storage's host (`redacted`), and the
client library's exceptions, whose text holds the URL, are never chained.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from yarl import URL

from loraserve.common.errors import DataLoss
from loraserve.common.revisions.manifest import FileInfo
from loraserve.common.revisions.presigned import redacted
from loraserve.inference.cache.download import FileWriter

CHUNK = 1024 * 1024
_REFUSED = frozenset({400, 401, 403})


class UrlRefused(Exception):
    """Object storage refused the URL (expired or altered)."""


class StorageUnreachable(Exception):
    """No connection to object storage could be made."""


class ReadFailed(Exception):
    """A read from object storage failed after connecting."""


@dataclass(frozen=True)
class ReadSettings:
    """How files are read from object storage."""

    # Files at least twice this long are read as parallel ranged GETs of this size;
    # 0: one streamed GET per file.
    range_size: int = 0
    # Ranged GETs of one file at once.
    ranges_in_flight: int = 4
    # Seconds to wait for a connection before calling storage unreachable.
    connect_timeout_s: float = 5.0
    # Seconds without a byte from storage before a read fails.
    read_timeout_s: float = 30.0


class HttpReader:
    """Reads files from presigned URLs over one pool of HTTP connections."""

    def __init__(self, settings: ReadSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(
                sock_connect=self._settings.connect_timeout_s,
                sock_read=self._settings.read_timeout_s,
            )
            # No cookies, no proxies from the environment, no redirects followed:
            # the URL the store signed is the one read.
            self._session = aiohttp.ClientSession(
                timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
            )
        return self._session

    async def read(self, url: str, file: FileInfo, staging: Path) -> None:
        """Writes `file` into `staging`, checked against its size and SHA-256."""
        what = f"file {file.name!r} from {redacted(url)}"
        # encoded=True: the query goes out byte for byte as signed; requoting it
        # (yarl's default) may change the signed string and void the signature.
        target = URL(url, encoded=True)
        settings = self._settings
        ranged = settings.range_size > 0 and file.size >= 2 * settings.range_size
        try:
            if ranged:
                await self._read_ranges(target, file, staging)
            else:
                await self._read_stream(target, file, staging)
        except (DataLoss, UrlRefused, ReadFailed):
            raise
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
            raise StorageUnreachable(f"cannot connect to object storage for {what}") from None
        except (aiohttp.ClientError, TimeoutError, asyncio.IncompleteReadError) as exc:
            # The exception's own text may hold the URL: only its kind is kept.
            raise ReadFailed(f"reading {what} failed: {type(exc).__name__}") from None

    async def _read_stream(self, url: URL, file: FileInfo, staging: Path) -> None:
        writer = await asyncio.to_thread(FileWriter, staging, file)
        # One chunk is written and hashed in a thread while the next is received.
        writing: asyncio.Future[None] | None = None
        try:
            async with self._client().get(url, allow_redirects=False) as response:
                _check_status(response, file, url)
                _check_length(response, file.size, file)
                offset = 0
                while offset < file.size:
                    data = await response.content.readexactly(min(CHUNK, file.size - offset))
                    if writing is not None:
                        await writing
                    writing = asyncio.ensure_future(asyncio.to_thread(writer.write, offset, data))
                    offset += len(data)
                if await response.content.read(1):
                    raise DataLoss(
                        f"file {file.name!r}: more than the manifest's {file.size} bytes"
                    )
            if writing is not None:
                await writing
            await asyncio.to_thread(writer.finish)
        finally:
            if writing is not None:
                # The thread may still be writing: the file closes after it.
                await asyncio.wait([writing])
                if not writing.cancelled():
                    writing.exception()
            await asyncio.to_thread(writer.close)

    async def _read_ranges(self, url: URL, file: FileInfo, staging: Path) -> None:
        path = staging / file.name
        fd = await asyncio.to_thread(_create, path, file.size)
        try:
            step = self._settings.range_size
            slots = asyncio.Semaphore(self._settings.ranges_in_flight)
            reads = [
                asyncio.ensure_future(
                    self._read_range(url, file, fd, start, min(file.size, start + step), slots)
                )
                for start in range(0, file.size, step)
            ]
            try:
                await asyncio.gather(*reads)
            finally:
                for read in reads:
                    read.cancel()
                await asyncio.gather(*reads, return_exceptions=True)
            await asyncio.to_thread(os.fsync, fd)
        finally:
            await asyncio.to_thread(os.close, fd)
        digest = await asyncio.to_thread(_sha256_of, path)
        if digest != file.sha256:
            raise DataLoss(
                f"file {file.name!r}: sha256 {digest} does not match the manifest's {file.sha256}"
            )

    async def _read_range(
        self, url: URL, file: FileInfo, fd: int, start: int, end: int, slots: asyncio.Semaphore
    ) -> None:
        headers = {"Range": f"bytes={start}-{end - 1}"}
        async with slots, self._client().get(url, headers=headers, allow_redirects=False) as got:
            _check_status(got, file, url, ranged=True)
            _check_length(got, end - start, file)
            position = start
            while position < end:
                data = await got.content.readexactly(min(CHUNK, end - position))
                await asyncio.to_thread(os.pwrite, fd, data, position)
                position += len(data)


def _check_status(
    response: aiohttp.ClientResponse, file: FileInfo, url: URL, ranged: bool = False
) -> None:
    what = f"file {file.name!r} from {redacted(str(url))}"
    if response.status in _REFUSED:
        raise UrlRefused(f"object storage refused the URL of {what}: HTTP {response.status}")
    if response.status != (206 if ranged else 200):
        raise ReadFailed(f"object storage answered HTTP {response.status} for {what}")


def _check_length(response: aiohttp.ClientResponse, expected: int, file: FileInfo) -> None:
    length = response.content_length
    if length is not None and length != expected:
        raise DataLoss(
            f"file {file.name!r}: object storage holds {length} bytes where the manifest "
            f"says {expected}"
        )


def _create(path: Path, size: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.ftruncate(fd, size)
    return fd


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
