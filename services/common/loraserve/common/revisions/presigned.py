"""A revision's presigned download URLs, as the store hands them out and a replica
reads them (`GetDownloadUrls`): its manifest and where each file's bytes can be read.

A URL is a bearer credential until it expires: reprs hide it, and no log line or
error message in loraserve holds one (`redacted` names a URL without its path and
query).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

from loraserve.common.errors import DataLoss
from loraserve.common.revisions.manifest import Revision


@dataclass(frozen=True, slots=True)
class FileUrl:
    """Where one file of the manifest can be read with a plain HTTP GET."""

    name: str
    url: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class RevisionUrls:
    """The manifest and one URL per file, in manifest order, valid until `expire_time`."""

    manifest: Revision
    urls: tuple[FileUrl, ...]
    expire_time: datetime

    def url_of(self, file_name: str) -> str:
        for file in self.urls:
            if file.name == file_name:
                return file.url
        raise DataLoss(
            f"download URLs of {self.manifest.adapter_name}@{self.manifest.revision}: "
            f"none for file {file_name!r}"
        )


def redacted(url: str) -> str:
    """The URL's scheme and host only: safe to log or to put in an error message."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or '?'}"
