"""Pushing a revision to the adapter store: the one upload every caller uses
(adapterctl, the demo, the benchmarks).

The stream is the proto's: a header naming every file with its size and SHA-256,
then each file's contents in 1 MiB chunks, files in header order. Files are read
a chunk at a time in a worker thread, so a 2 GiB adapter needs no 2 GiB of memory.

A push is a client-streaming call: gRPC's retry policy cannot resend what no longer
fits its per-call buffer, so `push` retries UNAVAILABLE itself (with `stamina`),
sending the same idempotency key each time: a push the store committed before the
failure is answered with its original revision instead of being made twice. With a
key it also retries CANCELLED from the store, which a store shutting down answers for
a push it had received but not begun (grpc/grpc#41785); the key makes that safe even
had it begun.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import grpc
from opentelemetry.trace import SpanKind, Tracer

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.rpc import retrylog
from loraserve.common.rpc.clientstream import ClientStream
from loraserve.common.tracing import tracer

CHUNK_SIZE = 1024 * 1024
PUSH_ATTEMPTS = 3
_WAIT_INITIAL_S = 0.5
_WAIT_MAX_S = 4.0
# The process's tracer; adapterctl passes a push's own (`spans`).
_TRACER = tracer(__name__)
_UPLOAD_ATTRIBUTES = {
    "rpc.system": "grpc",
    "rpc.service": pb.DESCRIPTOR.services_by_name["AdapterStoreService"].full_name,
    "rpc.method": "PushAdapter",
}


@dataclass(frozen=True)
class LocalFile:
    """A file to publish, with the size and digest it had when it was hashed."""

    name: str
    path: Path
    size: int
    sha256: str


class HashedFiles(Protocol):
    """The files of one push, in the order they are streamed."""

    @property
    def files(self) -> Sequence[LocalFile]: ...


class LocalFileError(Exception):
    """A file of the push cannot be read as it was hashed; nothing the store did."""


def new_idempotency_key() -> str:
    """A key for one intended change: made once, reused by every retry of it."""
    return str(uuid.uuid4())


_RETRIED_WITH_KEY = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})


def _retried(idempotency_key: str) -> Callable[[Exception], bool]:
    """stamina's `on`: UNAVAILABLE always, CANCELLED (from the store) with a key."""
    codes = _RETRIED_WITH_KEY if idempotency_key else {grpc.StatusCode.UNAVAILABLE}

    def retried(exc: Exception) -> bool:
        return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in codes

    return retried


async def push(
    stub: Any,
    name: str,
    files: HashedFiles,
    *,
    no_promote: bool,
    description: str,
    timeout_s: float | None,
    idempotency_key: str,
    progress: Callable[[int], None] = lambda _: None,
    on_retry: Callable[[grpc.aio.AioRpcError], None] = lambda _: None,
    attempts: int = PUSH_ATTEMPTS,
    signature: bytes = b"",
    spans: Tracer = _TRACER,
) -> pb.PushAdapterResponse:
    """`upload`, again after a jittered backoff while it fails UNAVAILABLE (or, with
    an idempotency key, CANCELLED by the store), at most `attempts` times; `on_retry`
    hears of each failure that is retried. Each attempt is a span of `spans`."""
    retried = _retried(idempotency_key)
    async for attempt in retrylog.retry_context(
        "adapterstore.push",
        on=retried,
        attempts=attempts,
        timeout=None,
        wait_initial=_WAIT_INITIAL_S,
        wait_max=_WAIT_MAX_S,
        wait_jitter=_WAIT_INITIAL_S,
    ):
        with attempt:
            try:
                return await upload(
                    stub,
                    name,
                    files,
                    no_promote=no_promote,
                    description=description,
                    timeout_s=timeout_s,
                    idempotency_key=idempotency_key,
                    progress=progress,
                    signature=signature,
                    spans=spans,
                )
            except grpc.aio.AioRpcError as exc:
                if retried(exc) and attempt.num < attempts:
                    on_retry(exc)
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def push_header(
    name: str,
    files: HashedFiles,
    *,
    no_promote: bool,
    description: str,
    idempotency_key: str,
    signature: bytes = b"",
) -> pb.PushAdapterRequest:
    return pb.PushAdapterRequest(
        header=pb.PushHeader(
            name=name,
            files=[pb.FileInfo(name=f.name, size=f.size, sha256=f.sha256) for f in files.files],
            no_promote=no_promote,
            description=description,
            idempotency_key=idempotency_key,
            signature=signature,
        )
    )


async def upload(
    stub: Any,
    name: str,
    files: HashedFiles,
    *,
    no_promote: bool,
    description: str,
    timeout_s: float | None,
    idempotency_key: str,
    progress: Callable[[int], None] = lambda _: None,
    signature: bytes = b"",
    spans: Tracer = _TRACER,
) -> pb.PushAdapterResponse:
    """Streams one push; a rejected push raises the call's AioRpcError. A retry of
    the push must pass the same `idempotency_key` (`push` does), and the same
    `signature` (a signed push's, see loraserve.common.trust.signing).

    The store may refuse the push before it has all been sent (no token, a file over
    its limits, a bad file): writing stops then, and the store's status is raised.
    The call is a `loraserve.ctl.upload` span (the store's spans are its children),
    each file a `loraserve.ctl.upload_file` under it.
    """
    header = push_header(
        name,
        files,
        no_promote=no_promote,
        description=description,
        idempotency_key=idempotency_key,
        signature=signature,
    )
    with spans.start_as_current_span("loraserve.ctl.upload", kind=SpanKind.CLIENT) as span:
        if span.is_recording():
            span.set_attributes(_UPLOAD_ATTRIBUTES)
        # Opened inside the span: the call sends the span's context to the store.
        stream: ClientStream[pb.PushAdapterRequest, pb.PushAdapterResponse] = ClientStream(
            stub.PushAdapter(timeout=timeout_s)
        )
        try:
            if await stream.write(header):
                for local in files.files:
                    with spans.start_as_current_span("loraserve.ctl.upload_file") as file_span:
                        if file_span.is_recording():
                            file_span.set_attributes(
                                {"loraserve.file": local.name, "loraserve.bytes": local.size}
                            )
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
        raise LocalFileError(f"{local.path}: cannot read: {exc.strerror}") from None
    try:
        offset = 0
        while offset < local.size:
            data = await asyncio.to_thread(f.read, min(CHUNK_SIZE, local.size - offset))
            if not data:
                raise LocalFileError(
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
