"""Snapshots of the folded state: written in the background, in the storage format
every store on the bucket can read, and read back in any format this release knows.

    snapshots/<seq:020d>.json   format 1: the state's JSON
                                format 2: the same JSON, saying format 2, gzip-compressed

Which format a snapshot is written in is asked at each write (compat/gate.py): a
store that may share the bucket with a store of 0.1.0 writes format 1, which that
store reads; otherwise format 2, a fraction of the bytes to store and to read at
each start. A snapshot is told apart by its first bytes, not its key, so every
version lists, orders and prunes the same keys.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import Callable

from loraserve.adapterstore.blobs import BlobStore
from loraserve.adapterstore.catalog import StoreState, state_within_limits
from loraserve.adapterstore.changelog.logstorage import SNAPSHOT_PREFIX, snapshot_and_prune
from loraserve.common.errors import DataLoss

log = logging.getLogger(__name__)

_GZIP_MAGIC = b"\x1f\x8b"
# Fast: the snapshot is the state's JSON, whose digests dominate and barely compress
# further at higher levels (docs/design.md, "Storage formats").
_GZIP_LEVEL = 1
COMPRESSED_FORMAT = 2


def compress(data: bytes, storage_format: int) -> bytes:
    """The snapshot's JSON as `storage_format` stores it; run off the event loop, on
    bytes encoded at the state's seq (the state may change meanwhile)."""
    if storage_format >= COMPRESSED_FORMAT:
        return gzip.compress(data, compresslevel=_GZIP_LEVEL)
    return data


async def latest_snapshot(blobs: BlobStore) -> tuple[StoreState, int] | None:
    """The newest snapshot's state and storage format; None when there is none."""
    keys = await blobs.list_keys(SNAPSHOT_PREFIX)
    if not keys:
        return None
    data = await blobs.get(keys[-1])
    try:
        # In a worker thread: the event loop keeps answering (health, at least)
        # while a snapshot of many adapters is decoded.
        return await asyncio.to_thread(_decode_snapshot, data)
    except (ValueError, KeyError, TypeError, EOFError, gzip.BadGzipFile) as e:
        raise DataLoss(f"snapshot {keys[-1]} is corrupt: {e}") from e


def _decode_snapshot(data: bytes) -> tuple[StoreState, int]:
    if data.startswith(_GZIP_MAGIC):
        data = gzip.decompress(data)
    document = json.loads(data)
    state = StoreState.from_json(document)
    state_within_limits(state)
    # Primes every adapter's encoding, so the next snapshot encodes only what
    # changes from now on (the state is not shared yet).
    state.encode()
    return state, int(document["format"])


class SnapshotWriter:
    """Writes snapshots of the state, and prunes, in the background: the commit that
    asked for one returns at once. While one snapshot is still being written, the
    next waits for it and then covers the state as it is by then, so the newest
    commits are never left without one."""

    def __init__(
        self,
        blobs: BlobStore,
        log_retention: int,
        state: Callable[[], StoreState],
        storage_format: Callable[[], int],
    ) -> None:
        self._blobs = blobs
        self._log_retention = log_retention
        self._state = state
        self._storage_format = storage_format
        self._writing: asyncio.Task[None] | None = None
        # A snapshot was asked for while one was being written: one more follows it.
        self._due = False
        self._replace = False

    def request(self, *, replace: bool = False) -> None:
        """Asks for a snapshot of the state as it is when it is written. With `replace`,
        one already at that seq is written over (the same state, in another format)."""
        self._replace = self._replace or replace
        if self._writing is not None and not self._writing.done():
            self._due = True
            log.info(
                "log.snapshot_deferred seq=%d: the previous one is still being written",
                self._state().seq,
            )
            return
        self._writing = asyncio.create_task(
            self._write_until_done(), name=f"changelog-snapshot-{self._state().seq}"
        )
        self._writing.add_done_callback(_log_snapshot_bug)

    async def close(self) -> None:
        if self._writing is not None:
            self._writing.cancel()
            await asyncio.gather(self._writing, return_exceptions=True)
            self._writing = None

    async def _write_until_done(self) -> None:
        """Each encoding is taken with the seq it belongs to, in one step, and reuses
        every unchanged adapter's."""
        while True:
            self._due = False
            state, storage_format = self._state(), self._storage_format()
            seq, data = state.seq, state.encode(storage_format)
            data = await asyncio.to_thread(compress, data, storage_format)
            replace, self._replace = self._replace, False
            await snapshot_and_prune(
                self._blobs, seq, data, self._log_retention, storage_format, replace=replace
            )
            if not self._due:
                return


def _log_snapshot_bug(task: asyncio.Task[None]) -> None:
    """A snapshot failing other than for storage being unavailable is a bug; nobody
    awaits the task, so it is logged here. The next snapshot covers the skipped one."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("log.snapshot_bug", exc_info=exc)
