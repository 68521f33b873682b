"""Pushes for tests: into an `AdapterStore` directly, or as gRPC requests like adapterctl's."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from loraserve.adapterstore.files.push import Chunk, PushHeader, PushResult
from loraserve.adapterstore.store import AdapterStore
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.revisions.manifest import FileInfo
from loraserve.testing.adapters.files import AdapterFiles


def declared(files: AdapterFiles) -> list[FileInfo]:
    return [FileInfo(name, len(data), "") for name, data in files.items()]


def hashed(files: AdapterFiles) -> list[FileInfo]:
    """Each file with its sha256, as adapterctl declares (and signs) them."""
    return [
        FileInfo(name, len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items()
    ]


async def chunks_of(files: AdapterFiles, chunk_size: int = 1000) -> AsyncIterator[Chunk]:
    for name, data in files.items():
        for offset in range(0, len(data), chunk_size):
            yield Chunk(name, offset, data[offset : offset + chunk_size])


async def push(
    store: AdapterStore,
    name: str,
    files: AdapterFiles,
    *,
    no_promote: bool = False,
    header_files: list[FileInfo] | None = None,
    chunks: AsyncIterator[Chunk] | None = None,
    idempotency_key: str = "",
    description: str = "",
) -> PushResult:
    header = PushHeader(
        name, header_files or declared(files), no_promote, description, idempotency_key
    )
    return await store.push(header, chunks or chunks_of(files), "tester")


def push_requests(
    name: str,
    files: AdapterFiles,
    chunk_size: int = 256 * 1024,
    declare_sha256: bool = True,
    infos: Sequence[FileInfo] | None = None,
    **header: Any,
) -> Iterator[pb.PushAdapterRequest]:
    """A push as adapterctl sends it: each file's sha256 declared unless told not to
    (`infos`: the header's files, when the caller hashed them already)."""
    if infos is None:
        infos = hashed(files) if declare_sha256 else declared(files)
    yield pb.PushAdapterRequest(
        header=pb.PushHeader(
            name=name,
            files=[pb.FileInfo(name=f.name, size=f.size, sha256=f.sha256) for f in infos],
            **header,
        )
    )
    for file_name, data in files.items():
        for offset in range(0, len(data), chunk_size):
            chunk = pb.FileChunk(
                file_name=file_name, offset=offset, data=data[offset : offset + chunk_size]
            )
            yield pb.PushAdapterRequest(chunk=chunk)
