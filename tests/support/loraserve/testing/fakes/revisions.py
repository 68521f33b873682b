"""A revision source in memory for the adapter cache's tests (`RevisionSource`)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator
from datetime import UTC, datetime

from loraserve.clients.downloads import FileChunk
from loraserve.common.errors import NotFound, Unimplemented
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.revisions.presigned import RevisionUrls


def file_info(name: str, data: bytes) -> FileInfo:
    return FileInfo(name, len(data), hashlib.sha256(data).hexdigest())


class FakeSource:
    """Serves revisions from memory, optionally corrupting what it sends."""

    def __init__(self, chunk_size: int = 1000) -> None:
        self.revisions: dict[tuple[str, int], dict[str, bytes]] = {}
        self.manifests: dict[tuple[str, int], Revision] = {}
        self.downloads = 0
        # Names of the revisions downloaded, in the order their downloads began.
        self.started: list[str] = []
        self.url_requests = 0
        self.lookups = 0
        self.corrupt_downloads = 0
        self.chunk_size = chunk_size
        # With `hold` set, each download sends everything and then waits for it before
        # its stream ends: the transfer is on the cache's disk and not over yet.
        # `holding` counts the downloads waiting there.
        self.hold: asyncio.Event | None = None
        self.holding = 0

    def add(self, name: str, revision: int, files: dict[str, bytes]) -> Revision:
        manifest = Revision(
            adapter_name=name,
            revision=revision,
            files=tuple(file_info(n, d) for n, d in files.items()),
            base_model="tiny",
            rank=8,
            alpha=16.0,
            target_modules=("q_proj", "v_proj"),
            create_time=datetime(2026, 1, 1, tzinfo=UTC),
            pushed_by="test",
            description="",
            seq=revision,
        )
        self.revisions[(name, revision)] = files
        self.manifests[(name, revision)] = manifest
        return manifest

    async def get_revision(self, name: str, revision: int) -> Revision:
        self.lookups += 1
        return self._manifest(name, revision)

    def _manifest(self, name: str, revision: int) -> Revision:
        if (name, revision) not in self.manifests:
            raise NotFound(f"no revision {name}@{revision}")
        return self.manifests[(name, revision)]

    async def download_urls(self, name: str, revision: int) -> RevisionUrls:
        # Revisions in memory have no object storage to read directly: the stream it is.
        self.url_requests += 1
        raise Unimplemented("the fake source hands out no download URLs")

    async def download(
        self, name: str, revision: int
    ) -> AsyncGenerator[Revision | FileChunk, None]:
        self.downloads += 1
        self.started.append(name)
        yield self._manifest(name, revision)
        corrupt = self.corrupt_downloads > 0
        self.corrupt_downloads -= 1
        for file_name, data in self.revisions[(name, revision)].items():
            if corrupt and file_name == "adapter_model.safetensors":
                data = b"\xff" + data[1:]
            for offset in range(0, len(data), self.chunk_size):
                yield FileChunk(file_name, offset, data[offset : offset + self.chunk_size])
        if self.hold is not None:
            self.holding += 1
            try:
                await self.hold.wait()
            finally:
                self.holding -= 1
