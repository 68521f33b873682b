"""Receiving one revision's download stream into a staging directory.

The stream is the manifest, then each file's chunks in manifest order. Everything
from the network is checked as it arrives: file names are plain names, chunks come
in order and never run past the manifest's sizes, and each finished file's size and
SHA-256 match the manifest. Any breach is DataLoss.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncGenerator
from contextlib import aclosing
from pathlib import Path
from typing import BinaryIO

from loraserve.clients.downloads import FileChunk
from loraserve.common.errors import DataLoss
from loraserve.common.revisions.manifest import FileInfo, Revision

# Kept beside a revision's files in the cache; never a name a download may use.
MANIFEST_FILE = ".manifest.json"


class Receiver:
    """Checks a download stream's order against its manifest while writing it out."""

    def __init__(self, name: str, revision: int, staging: Path) -> None:
        self._what = f"download of {name}@{revision}"
        self._name = name
        self._revision = revision
        self._staging = staging
        self._manifest: Revision | None = None
        self._pending: list[FileInfo] = []
        self._writer: FileWriter | None = None

    def take_manifest(self, manifest: Revision) -> None:
        if self._manifest is not None:
            raise DataLoss(f"{self._what}: a second manifest")
        self._manifest = check_manifest(manifest, self._name, self._revision)
        self._pending = list(manifest.files)

    async def take_chunk(self, chunk: FileChunk) -> None:
        if self._manifest is None:
            raise DataLoss(f"{self._what}: data before the manifest")
        if self._writer is None or self._writer.file.name != chunk.file_name:
            await self._next_file(chunk.file_name)
        assert self._writer is not None
        await asyncio.to_thread(self._writer.write, chunk.offset, chunk.data)

    async def _next_file(self, file_name: str) -> None:
        await self._finish_writer()
        # Empty files send no chunk at all.
        while self._pending and self._pending[0].size == 0 and self._pending[0].name != file_name:
            await asyncio.to_thread(write_empty, self._staging, self._pending.pop(0))
        if not self._pending or self._pending[0].name != file_name:
            raise DataLoss(f"{self._what}: unexpected file {file_name!r}, not next in the manifest")
        self._writer = await asyncio.to_thread(FileWriter, self._staging, self._pending.pop(0))

    async def finish(self) -> Revision:
        if self._manifest is None:
            raise DataLoss(f"{self._what}: the stream ended without a manifest")
        await self._finish_writer()
        for remaining in self._pending:
            await asyncio.to_thread(write_empty, self._staging, remaining)
        return self._manifest

    async def _finish_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            await asyncio.to_thread(writer.finish)

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.to_thread(self._writer.close)


class FileWriter:
    """Writes one file sequentially, hashing as it goes. Runs in worker threads."""

    def __init__(self, directory: Path, file: FileInfo) -> None:
        self.file = file
        self._path = directory / file.name
        self._out: BinaryIO = self._path.open("xb")
        self._hash = hashlib.sha256()
        self._size = 0

    def write(self, offset: int, data: bytes) -> None:
        if offset != self._size:
            raise DataLoss(
                f"file {self.file.name!r}: chunk at offset {offset}, expected {self._size}"
            )
        if self._size + len(data) > self.file.size:
            raise DataLoss(
                f"file {self.file.name!r}: more than the manifest's {self.file.size} bytes"
            )
        self._out.write(data)
        self._hash.update(data)
        self._size += len(data)

    def finish(self) -> None:
        try:
            self._out.flush()
            os.fsync(self._out.fileno())
        finally:
            self.close()
        if self._size != self.file.size:
            raise DataLoss(
                f"file {self.file.name!r}: got {self._size} bytes, manifest says {self.file.size}"
            )
        digest = self._hash.hexdigest()
        if digest != self.file.sha256:
            raise DataLoss(
                f"file {self.file.name!r}: sha256 {digest} does not match the manifest's "
                f"{self.file.sha256}"
            )

    def close(self) -> None:
        self._out.close()


def write_empty(directory: Path, file: FileInfo) -> None:
    # finish() rejects a non-empty manifest entry that received no data.
    FileWriter(directory, file).finish()


def check_manifest(manifest: Revision, name: str, revision: int) -> Revision:
    if manifest.adapter_name != name or manifest.revision != revision:
        raise DataLoss(
            f"download of {name}@{revision}: the store sent "
            f"{manifest.adapter_name}@{manifest.revision} instead"
        )
    seen: set[str] = set()
    for file in manifest.files:
        # Names come from the network: only plain file names, never a path or our own marker.
        if (
            not file.name
            or file.name in (".", "..", MANIFEST_FILE)
            or file.name.startswith(".")
            or "/" in file.name
            or "\\" in file.name
            or "\0" in file.name
        ):
            raise DataLoss(f"download of {name}@{revision}: bad file name {file.name!r}")
        if file.name in seen:
            raise DataLoss(f"download of {name}@{revision}: file {file.name!r} listed twice")
        if file.size < 0 or len(file.sha256) != 64:
            raise DataLoss(f"download of {name}@{revision}: bad size or digest of {file.name!r}")
        seen.add(file.name)
    return manifest


async def receive_revision(
    stream: AsyncGenerator[Revision | FileChunk, None], expected: Revision, staging: Path
) -> Revision:
    """Writes a download stream into `staging`, checked as it arrives; the stream's
    manifest must list the files `expected` (what the event or listing said) lists."""
    name, revision = expected.adapter_name, expected.revision
    receiver = Receiver(name, revision, staging)
    try:
        async with aclosing(stream):
            async for message in stream:
                if isinstance(message, Revision):
                    if not same_files(message, expected):
                        raise DataLoss(
                            f"download of {name}@{revision}: the stream's manifest lists "
                            "other files than the store's event or listing"
                        )
                    receiver.take_manifest(message)
                else:
                    await receiver.take_chunk(message)
        return await receiver.finish()
    finally:
        await receiver.close()


def same_files(a: Revision, b: Revision) -> bool:
    return sorted(a.files, key=lambda f: f.name) == sorted(b.files, key=lambda f: f.name)
