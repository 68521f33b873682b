"""What a download delivers to the inference service: the chunks of a
`DownloadAdapter` stream, or a revision's presigned URLs (`GetDownloadUrls`,
`loraserve.common.revisions.presigned`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.revisions.manifest import revision_from_proto
from loraserve.common.revisions.presigned import FileUrl, RevisionUrls


@dataclass(frozen=True, slots=True)
class FileChunk:
    """Bytes of one file of a download, at `offset`."""

    file_name: str
    offset: int
    data: bytes


def revision_urls_from_proto(message: pb.GetDownloadUrlsResponse) -> RevisionUrls:
    return RevisionUrls(
        revision_from_proto(message.manifest),
        tuple(FileUrl(u.file_name, u.url) for u in message.urls),
        message.expire_time.ToDatetime(tzinfo=UTC),
    )
