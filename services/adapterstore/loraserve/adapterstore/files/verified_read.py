"""Reading a stored file back in chunks, checked against its manifest entry.

The file's last chunk is held back until its size and sha256 match the
manifest, so a corrupt or missing blob ends the stream with DataLoss before
the reader has the whole file.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator

from loraserve.adapterstore.blobs import BlobNotFound, BlobStore, blob_key
from loraserve.adapterstore.files.push import Chunk
from loraserve.common.errors import DataLoss
from loraserve.common.revisions.manifest import FileInfo

log = logging.getLogger(__name__)


async def read_verified(blobs: BlobStore, info: FileInfo, chunk_size: int) -> AsyncIterator[Chunk]:
    digest = hashlib.sha256()
    offset = 0
    held: Chunk | None = None
    try:
        async for data in blobs.stream(blob_key(info.sha256), chunk_size):
            if held is not None:
                yield held
            digest.update(data)
            held = Chunk(info.name, offset, data)
            offset += len(data)
    except BlobNotFound:
        raise DataLoss(f"blob of file {info.name!r} (sha256 {info.sha256}) is missing") from None
    if offset != info.size or digest.hexdigest() != info.sha256:
        log.error("blob.corrupt file=%s sha256=%s size=%d", info.name, info.sha256, offset)
        raise DataLoss(
            f"blob of file {info.name!r} is corrupt: {offset} bytes with sha256 "
            f"{digest.hexdigest()}, expected {info.size} bytes with sha256 {info.sha256}"
        )
    if held is not None:
        yield held
