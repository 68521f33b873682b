"""Receives a pushed adapter: streams each file to a blob upload while checking it.

Files arrive as chunks, file by file in header order, offsets sequential. Each
file streams into its own upload, so memory stays bounded by the upload's parts
in flight. The safetensors header is checked as soon as it has arrived, and every
weight value (finite: `loraserve.common.revisions.lora_values`) as its chunk arrives, before
the chunk is uploaded, so a bad file is refused before gigabytes are uploaded.
Uploads stay invisible until the whole push has validated and `keep_files` keeps
them; on any failure before that, cancellation included, every upload is aborted
before the error propagates. The abort runs in its own task, shielded: grpc cancels
a cancelled call's handler again while it cleans up, and an abort cut short would
leave an incomplete multipart upload behind (the store sweeps old ones at start-up,
see s3sweep).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from loraserve.adapterstore.blobs import BlobUpload, ReceivedBlob
from loraserve.adapterstore.catalog import Change
from loraserve.adapterstore.files.validation import (
    LoraConfig,
    check_tensors_match_config,
    parse_adapter_config,
)
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.lora_values import WeightsFileCheck
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.revisions.peft_format import CONFIG_FILE, WEIGHTS_FILE, TensorInfo
from loraserve.common.tracing import child_span, tracer

# Checks of at most this many bytes run on the event loop (well under a millisecond).
INLINE_CHECK_BYTES = 64 * 1024

log = logging.getLogger(__name__)
_TRACER = tracer(__name__)


class Uploads(Protocol):
    """Where a push's files go: a BlobStore, or uploads that only hash (hashonly.py)."""

    async def start_upload(self, sha256: str = "") -> BlobUpload: ...


@dataclass(frozen=True, slots=True)
class PushHeader:
    name: str
    files: list[FileInfo]  # sha256 "" when the client did not give one
    no_promote: bool
    description: str
    idempotency_key: str = ""
    signature: bytes = b""  # the model-signing bundle; b"" when unsigned


@dataclass(frozen=True, slots=True)
class PushResult:
    """What a committed push made: the revision, whether it became current, its seq."""

    revision: Revision
    promoted: bool
    seq: int

    @classmethod
    def of(cls, change: Change) -> PushResult:
        """The result of the push `change` committed."""
        assert change.revision is not None
        promoted = change.current_revision == change.revision.revision
        return cls(change.revision, promoted, change.seq)


@dataclass(frozen=True, slots=True)
class Chunk:
    file_name: str
    offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ReceivedFile:
    info: FileInfo
    upload: BlobUpload


@dataclass(frozen=True, slots=True)
class ReceivedAdapter:
    """A fully received and validated push; its uploads are finished, not yet kept."""

    files: list[ReceivedFile]
    config: LoraConfig

    @property
    def infos(self) -> tuple[FileInfo, ...]:
        """Each file's name, size and sha256, as received."""
        return tuple(f.info for f in self.files)


class _FileReceiver:
    def __init__(self, declared: FileInfo, upload: BlobUpload) -> None:
        self.declared = declared
        self.upload = upload
        self.received = 0
        # The config is checked whole, in memory (its size is bounded at the header).
        self.captured = bytearray()
        self.weights = WeightsFileCheck(declared.size) if declared.name == WEIGHTS_FILE else None

    @property
    def tensors(self) -> list[TensorInfo] | None:
        return self.weights.tensors if self.weights is not None else None

    async def write(self, chunk: Chunk) -> None:
        name = self.declared.name
        if chunk.offset != self.received:
            raise InvalidArgument(
                f"file {name!r}: chunk at offset {chunk.offset}, expected offset {self.received}"
            )
        if self.received + len(chunk.data) > self.declared.size:
            raise InvalidArgument(
                f"file {name!r}: more than the declared {self.declared.size} bytes were sent"
            )
        self.received += len(chunk.data)
        if self.weights is not None:
            if self.weights.cost(len(chunk.data)) <= INLINE_CHECK_BYTES:
                # A thread hop costs more than checking a few KiB, and a client sending
                # tiny chunks must not cost the store one hop per chunk.
                self.weights.update(chunk.data)
            else:
                # Parsing a header of up to 100 MiB and checking a chunk's values are CPU work.
                await asyncio.to_thread(self.weights.update, chunk.data)
        elif name == CONFIG_FILE:
            self.captured += chunk.data
        await self.upload.write(chunk.data)

    async def finish(self) -> ReceivedBlob:
        name = self.declared.name
        if self.received != self.declared.size:
            raise InvalidArgument(
                f"file {name!r}: received {self.received} of the "
                f"declared {self.declared.size} bytes"
            )
        if self.weights is not None:
            self.weights.finish()
        return await self.upload.finish()


async def receive_adapter(
    header: PushHeader, chunks: AsyncIterator[Chunk], blobs: Uploads
) -> ReceivedAdapter:
    """Uploads and validates every declared file, keeping none of them. The header's
    names, sizes and sha256s must already have passed `validation.check_declared_files`."""
    push = _PushReceiver(header.files, blobs)
    # One span for every file: its parts' uploads are its children.
    with child_span(_TRACER, "loraserve.store.receive") as span:
        try:
            async for chunk in chunks:
                await push.write(chunk)
            await push.open_next(None)
            config = parse_adapter_config(push.config_bytes)
            check_tensors_match_config(push.tensors, config)
        except BaseException:
            await shielded(push.abort())
            raise
        if span.is_recording():
            span.set_attribute("loraserve.bytes", sum(f.info.size for f in push.received))
    return ReceivedAdapter(push.received, config)


class _PushReceiver:
    """The files of one push, received one after another in header order."""

    def __init__(self, declared: list[FileInfo], blobs: Uploads) -> None:
        self._blobs = blobs
        self._pending = list(declared)
        self._current: _FileReceiver | None = None
        self.received: list[ReceivedFile] = []
        self.config_bytes = b""
        self.tensors: list[TensorInfo] = []

    async def write(self, chunk: Chunk) -> None:
        if self._current is None or chunk.file_name != self._current.declared.name:
            await self.open_next(chunk.file_name)
        assert self._current is not None
        await self._current.write(chunk)

    async def open_next(self, file_name: str | None) -> None:
        """Closes the current file and opens `file_name` (None: the end of the push),
        completing the empty files declared in between."""
        await self._close_current()
        if file_name is not None and all(f.name != file_name for f in self._pending):
            raise InvalidArgument(
                f"chunk for file {file_name!r}, which is not declared or was already sent"
            )
        while self._pending:
            declared = self._pending[0]
            if declared.name == file_name:
                self._pending.pop(0)
                self._current = await _open(declared, self._blobs)
                return
            if declared.size != 0:
                if file_name is None:
                    raise InvalidArgument(f"file {declared.name!r}: no bytes received")
                raise InvalidArgument(
                    f"chunk for file {file_name!r} arrived before file {declared.name!r} was sent; "
                    "files must be sent in header order"
                )
            self._pending.pop(0)
            self._current = await _open(declared, self._blobs)
            await self._close_current()

    async def _close_current(self) -> None:
        if self._current is None:
            return
        current, self._current = self._current, None
        try:
            blob = await current.finish()
        except BaseException:
            await shielded(_abort(current.upload))
            raise
        self.received.append(
            ReceivedFile(FileInfo(current.declared.name, blob.size, blob.sha256), current.upload)
        )
        _check_sha256(current.declared, blob)
        if current.declared.name == CONFIG_FILE:
            self.config_bytes = bytes(current.captured)
        elif current.declared.name == WEIGHTS_FILE and current.tensors is not None:
            self.tensors = current.tensors

    async def abort(self) -> None:
        """Aborts every upload this push started, the one in progress included."""
        if self._current is not None:
            await _abort(self._current.upload)
        await abort_files(self.received)


async def keep_files(received: ReceivedAdapter) -> None:
    """Makes every file of a validated push readable at its content address. A
    failure aborts the files not kept yet; the ones kept are correct content that no
    revision names (garbage, never visible)."""
    with child_span(_TRACER, "loraserve.store.keep"):
        for index, file in enumerate(received.files):
            try:
                await file.upload.keep()
            except BaseException:
                await shielded(abort_files(received.files[index:]))
                raise


async def abort_files(files: list[ReceivedFile]) -> None:
    for file in files:
        await _abort(file.upload)


async def _open(declared: FileInfo, blobs: Uploads) -> _FileReceiver:
    return _FileReceiver(declared, await blobs.start_upload(declared.sha256))


def _check_sha256(declared: FileInfo, blob: ReceivedBlob) -> None:
    if declared.sha256 and declared.sha256 != blob.sha256:
        raise InvalidArgument(
            f"file {declared.name!r}: sha256 {blob.sha256} of the received bytes does not "
            f"match the declared {declared.sha256}"
        )


# Cleanups still running after their caller was cancelled: asyncio keeps only weak
# references to tasks, and one collected mid-abort would leave its upload behind.
_cleanups: set[asyncio.Task[None]] = set()


async def shielded(cleanup: Coroutine[Any, Any, None]) -> None:
    """Runs `cleanup` to its end even when the caller is cancelled meanwhile (the
    caller's CancelledError still propagates at once)."""
    task = asyncio.ensure_future(cleanup)
    _cleanups.add(task)
    task.add_done_callback(_cleanups.discard)
    await asyncio.shield(task)


async def _abort(upload: BlobUpload) -> None:
    try:
        await upload.abort()
    except Exception:
        # The original error matters more; what an abort leaves is invisible garbage.
        log.warning("blob.abort_failed", exc_info=True)
