"""The change log's objects in storage: keys, parsing, reading entries, snapshots.

    log/<seq:020d>.json        one Change; the put with If-None-Match: * is the commit
    snapshots/<seq:020d>.json  the StoreState folded up to seq (its formats: snapshots.py)

Nothing here keeps state between calls. An entry read claims its own seq, and a
corrupt one raises DataLoss, never a half-parsed Change. What an older store kept
over today's field limits is read without those fields (catalog/withheld.py).
Entries are deleted in blocks, oldest first, so `is_gap` can tell a deleted entry
from one never written (docs/design.md, "Log retention is a count").
"""

from __future__ import annotations

import json
import logging

from loraserve.adapterstore.blobs import BlobNotFound, BlobStore
from loraserve.adapterstore.catalog import (
    Change,
    change_within_limits,
)
from loraserve.common.errors import DataLoss, OutOfRange, Unavailable

log = logging.getLogger(__name__)

LOG_PREFIX = "log/"
SNAPSHOT_PREFIX = "snapshots/"
# Snapshots kept besides the newest, for a reader that listed just before a prune.
_OLD_SNAPSHOTS_KEPT = 1
# Log entries seqs 1..100, 101..200, ...: the unit of deletion, oldest first.
PRUNE_BLOCK = 100


def log_key(seq: int) -> str:
    return f"{LOG_PREFIX}{seq:020d}.json"


def snapshot_key(seq: int) -> str:
    return f"{SNAPSHOT_PREFIX}{seq:020d}.json"


def _seq_of(key: str) -> int:
    return int(key.rsplit("/", 1)[-1].removesuffix(".json"))


def parse_change(data: bytes, seq: int) -> Change:
    try:
        change = Change.from_json(json.loads(data))
    except (ValueError, KeyError, TypeError) as e:
        raise DataLoss(f"log entry {seq} is corrupt: {e}") from e
    if change.seq != seq:
        raise DataLoss(f"log entry {seq} claims seq {change.seq}")
    return change_within_limits(change)


async def read_entries(blobs: BlobStore, first: int, last: int) -> list[Change]:
    """The entries `first`..`last`; OutOfRange when retention has deleted one."""
    changes = []
    for seq in range(first, last + 1):
        try:
            data = await blobs.get(log_key(seq))
        except BlobNotFound:
            oldest = await blobs.list_keys(LOG_PREFIX, limit=1)
            kept = f"log entry {_seq_of(oldest[0])}" if oldest else "no log entry"
            raise OutOfRange(
                f"changes after seq {first - 1} are no longer kept (oldest kept: {kept}); "
                f"list adapters and watch from the seq the listing returns"
            ) from None
        changes.append(parse_change(data, seq))
    return changes


async def is_gap(blobs: BlobStore, seq: int) -> bool:
    """Whether entry `seq + 1`, found missing, was deleted by retention (later entries
    exist) rather than not written yet (`seq` is the head). While the last entry of
    the block before `seq + 1`'s exists, no entry of that block was ever deleted
    (blocks go oldest first): one read, whatever the length of the log. Otherwise
    (the store's first block, or a retention shorter than a block) it is a gap
    exactly when a snapshot after `seq` exists, since retention deletes only what a
    snapshot covers: one short listing of the few snapshot keys."""
    fence = seq - seq % PRUNE_BLOCK
    if fence > 0:
        try:
            await blobs.get(log_key(fence))
            return False
        except BlobNotFound:
            pass
    return bool(await blobs.list_keys(SNAPSHOT_PREFIX, start_after=snapshot_key(seq), limit=1))


async def snapshot_and_prune(
    blobs: BlobStore,
    seq: int,
    data: bytes,
    log_retention: int,
    storage_format: int = 1,
    *,
    replace: bool = False,
) -> None:
    """Writes `data`, the state's snapshot at `seq` (over one already there only with
    `replace`), then prunes (unless `log_retention` is 0); a failure is only logged,
    since the next snapshot covers this one."""
    try:
        if replace:
            await blobs.put(snapshot_key(seq), data)
        else:
            await blobs.put_if_absent(snapshot_key(seq), data)
        log.info("log.snapshot_written seq=%d bytes=%d format=%d", seq, len(data), storage_format)
        if log_retention:
            await _prune(blobs, seq, seq - log_retention)
    except Unavailable:
        # The commit itself succeeded; the next snapshot will cover this one.
        log.warning("log.snapshot_failed seq=%d", seq, exc_info=True)


async def _prune(blobs: BlobStore, snapshot_seq: int, retention_floor: int) -> None:
    cutoff = min(snapshot_seq, retention_floor)
    if cutoff < 1:
        return
    # The keys to delete follow from the oldest seq: one key is listed, however long
    # the kept log is. A batch deletes in no order, so batches follow the blocks,
    # oldest first, as `is_gap` relies on.
    oldest = await blobs.list_keys(LOG_PREFIX, limit=1)
    first = _seq_of(oldest[0]) if oldest else cutoff + 1
    start = first
    while start <= cutoff:
        end = min(cutoff, start - (start - 1) % PRUNE_BLOCK + PRUNE_BLOCK - 1)
        await blobs.delete([log_key(seq) for seq in range(start, end + 1)])
        start = end + 1
    snapshots = await blobs.list_keys(SNAPSHOT_PREFIX)
    await blobs.delete(snapshots[: -1 - _OLD_SNAPSHOTS_KEPT])
    if first <= cutoff:
        log.info("log.pruned through_seq=%d entries=%d", cutoff, cutoff - first + 1)
