"""`adapterctl push`: hash a directory, with progress, for `loraserve.clients.push`
to stream to the store as one revision."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from opentelemetry.trace import Tracer

from loraserve.adapterctl.adapter_dir import (
    AdapterFiles,
    DirectoryListing,
    FileReading,
    list_adapter_dir,
    listing_size,
    read_into,
)
from loraserve.adapterctl.failures import UsageError
from loraserve.adapterctl.settings import CtlSettings
from loraserve.adapterctl.terminal.console import Console
from loraserve.adapterctl.terminal.output import dumps, message_to_json
from loraserve.adapterctl.terminal.progress import MIN_BYTES_FOR_BAR, Progress
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.names import validate_adapter_name
from loraserve.common.revisions.peft_format import PICKLE_SUFFIXES
from loraserve.common.tracing import tracer

# A push's spans come from its own tracer (push_trace); this one, the process's, for
# callers that trace with the global provider.
_TRACER = tracer(__name__)


def validated_name(name: str) -> str:
    try:
        return validate_adapter_name(name)
    except InvalidArgument as exc:
        raise UsageError(exc.message) from None


def progress_for(console: Console, label: str, total: int) -> Progress:
    return Progress(
        console.stderr, label, total, console.stderr_is_tty and total >= MIN_BYTES_FOR_BAR
    )


async def prepare_push(directory: Path, console: Console, spans: Tracer = _TRACER) -> AdapterFiles:
    """Selects and hashes the files of `directory`; warns about files left out. The
    hashing is `loraserve.ctl.hash`, a span of `spans` (a push's own, when traced)."""
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
    with spans.start_as_current_span("loraserve.ctl.hash") as span:
        try:
            files = await hash_in_steps(listing, progress.advance, spans)
        finally:
            progress.finish()
        if span.is_recording():
            span.set_attributes({"loraserve.files": len(files.files), "loraserve.bytes": total})
    return files


async def hash_in_steps(
    listing: DirectoryListing, progress: Callable[[int], None], spans: Tracer = _TRACER
) -> AdapterFiles:
    """`hash_files`, one chunk per worker-thread call, a span per file.

    A cancel (Ctrl-C) then ends hashing within a chunk. One call for the whole adapter
    would run on after the cancel, and asyncio's exit waits for its worker threads:
    Ctrl-C while hashing gigabytes did nothing until every byte was read.
    """
    files = []
    for path in listing.selected:
        with spans.start_as_current_span("loraserve.ctl.hash_file") as span:
            try:
                f: BinaryIO = await asyncio.to_thread(path.open, "rb")
                try:
                    size = await asyncio.to_thread(os.fstat, f.fileno())
                    reading = FileReading(path, size.st_size)
                    while read := await asyncio.to_thread(read_into, f, reading):
                        progress(read)
                finally:
                    await asyncio.to_thread(f.close)
            except OSError as exc:
                raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
            if span.is_recording():
                span.set_attributes({"loraserve.file": path.name, "loraserve.bytes": reading.size})
            # The values are checked chunk by chunk in the read above; what only the
            # whole file can tell (the weights' tiling, the config's LoRA scale) here.
            with spans.start_as_current_span("loraserve.ctl.value_check"):
                files.append(reading.finish())
    return AdapterFiles(listing.directory, tuple(files), listing.ignored)


def print_pushed(
    console: Console, settings: CtlSettings, response: pb.PushAdapterResponse, trace_id: str = ""
) -> None:
    """`NAME@REV`, or with --json the response (and the push's `trace_id` when traced)."""
    if settings.json:
        console.out(dumps(pushed_json(response, trace_id)))
    else:
        console.out(f"{response.revision.adapter_name}@{response.revision.revision}")


def pushed_json(response: pb.PushAdapterResponse, trace_id: str) -> dict[str, Any]:
    result = message_to_json(response)
    if trace_id:
        result["trace_id"] = trace_id
    return result
