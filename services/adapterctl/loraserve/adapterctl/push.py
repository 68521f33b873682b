"""`adapterctl push`: hash a directory, then stream it to the store as one revision.

The stream is the proto's: a header naming every file with its size and SHA-256,
then each file's contents in 1 MiB chunks, files in header order. Files are read
a chunk at a time in a worker thread, so a 2 GiB adapter needs no 2 GiB of memory.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from loraserve.adapterctl.adapter_dir import (
    CHUNK_SIZE,
    AdapterFiles,
    DirectoryListing,
    LocalFile,
    list_adapter_dir,
    listing_size,
    read_into,
)
from loraserve.adapterctl.console import Console
from loraserve.adapterctl.failures import UsageError
from loraserve.adapterctl.output import dumps, message_to_json
from loraserve.adapterctl.progress import MIN_BYTES_FOR_BAR, Progress
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.validation import PICKLE_SUFFIXES
from loraserve.common.clientstream import ClientStream
from loraserve.common.errors import InvalidArgument
from loraserve.common.names import validate_adapter_name


def validated_name(name: str) -> str:
    try:
        return validate_adapter_name(name)
    except InvalidArgument as exc:
        raise UsageError(exc.message) from None


def progress_for(console: Console, label: str, total: int) -> Progress:
    return Progress(
        console.stderr, label, total, console.stderr_is_tty and total >= MIN_BYTES_FOR_BAR
    )


async def prepare_push(directory: Path, console: Console) -> AdapterFiles:
    """Selects and hashes the files of `directory`; warns about files left out."""
    listing = await asyncio.to_thread(list_adapter_dir, directory)
    for ignored in listing.ignored:
        why = (
            "pickle formats are never uploaded"
            if ignored.endswith(PICKLE_SUFFIXES)
            else ("not an adapter file")
        )
        console.err(f"ignoring {directory / ignored} ({why})")
    total = await asyncio.to_thread(listing_size, listing)
    progress = progress_for(console, "hashing  ", total)
    try:
        return await hash_in_steps(listing, progress.advance)
    finally:
        progress.finish()


async def hash_in_steps(listing: DirectoryListing, progress: Callable[[int], None]) -> AdapterFiles:
    """`hash_files`, one chunk per worker-thread call.

    A cancel (Ctrl-C) then ends hashing within a chunk. One call for the whole adapter
    would run on after the cancel, and asyncio's exit waits for its worker threads:
    Ctrl-C while hashing gigabytes did nothing until every byte was read.
    """
    files = []
    for path in listing.selected:
        digest = hashlib.sha256()
        size = 0
        try:
            f: BinaryIO = await asyncio.to_thread(path.open, "rb")
            try:
                while read := await asyncio.to_thread(read_into, f, digest):
                    size += read
                    progress(read)
            finally:
                await asyncio.to_thread(f.close)
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
        files.append(LocalFile(path.name, path, size, digest.hexdigest()))
    return AdapterFiles(listing.directory, tuple(files), listing.ignored)


def push_header(
    name: str, files: AdapterFiles, *, no_promote: bool, description: str, idempotency_key: str
) -> pb.PushAdapterRequest:
    return pb.PushAdapterRequest(
        header=pb.PushHeader(
            name=name,
            files=[pb.FileInfo(name=f.name, size=f.size, sha256=f.sha256) for f in files.files],
            no_promote=no_promote,
            description=description,
            idempotency_key=idempotency_key,
        )
    )


async def upload(
    stub: Any,
    name: str,
    files: AdapterFiles,
    *,
    no_promote: bool,
    description: str,
    timeout_s: float | None,
    idempotency_key: str,
    progress: Callable[[int], None] = lambda _: None,
) -> pb.PushAdapterResponse:
    """Streams one push; a rejected push raises the call's AioRpcError. A retry of
    the push must pass the same `idempotency_key` (see cli.retry).

    The store may refuse the push before it has all been sent (no token, a file over
    its limits, a bad file): writing stops then, and the store's status is raised.
    """
    stream: ClientStream[pb.PushAdapterRequest, pb.PushAdapterResponse] = ClientStream(
        stub.PushAdapter(timeout=timeout_s)
    )
    try:
        if await stream.write(
            push_header(
                name,
                files,
                no_promote=no_promote,
                description=description,
                idempotency_key=idempotency_key,
            )
        ):
            for local in files.files:
                if not await _write_file(stream, local, progress):
                    break
        return await stream.result()
    except BaseException:
        stream.cancel()
        raise


async def _write_file(
    stream: ClientStream[pb.PushAdapterRequest, pb.PushAdapterResponse],
    local: LocalFile,
    progress: Callable[[int], None],
) -> bool:
    """Sends one file; False if the store ended the call first."""
    try:
        f: BinaryIO = await asyncio.to_thread(local.path.open, "rb")
    except OSError as exc:
        raise UsageError(f"{local.path}: cannot read: {exc.strerror}") from None
    try:
        offset = 0
        while offset < local.size:
            data = await asyncio.to_thread(f.read, min(CHUNK_SIZE, local.size - offset))
            if not data:
                raise UsageError(
                    f"{local.path}: shrank from {local.size} to {offset} bytes while uploading"
                )
            chunk = pb.FileChunk(file_name=local.name, offset=offset, data=data)
            if not await stream.write(pb.PushAdapterRequest(chunk=chunk)):
                return False
            offset += len(data)
            progress(len(data))
    finally:
        await asyncio.to_thread(f.close)
    return True


def print_pushed(console: Console, settings: CtlSettings, response: pb.PushAdapterResponse) -> None:
    if settings.json:
        console.out(dumps(message_to_json(response)))
    else:
        console.out(f"{response.revision.adapter_name}@{response.revision.revision}")
