"""An adapter's files in and out: receiving a push while checking it (validation),
hash-only pushes, reading a stored file back verified, and presigned download URLs."""

from loraserve.adapterstore.files.download_urls import DownloadUrls
from loraserve.adapterstore.files.hashonly import HashOnlyUploads
from loraserve.adapterstore.files.push import (
    Chunk,
    PushHeader,
    PushResult,
    keep_files,
    receive_adapter,
)
from loraserve.adapterstore.files.validation import (
    Limits,
    LoraConfig,
    check_declared_files,
)
from loraserve.adapterstore.files.verified_read import read_verified

__all__ = [
    "Chunk",
    "DownloadUrls",
    "HashOnlyUploads",
    "Limits",
    "LoraConfig",
    "PushHeader",
    "PushResult",
    "check_declared_files",
    "keep_files",
    "read_verified",
    "receive_adapter",
]
