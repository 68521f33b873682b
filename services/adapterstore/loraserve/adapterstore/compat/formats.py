"""Storage formats: which store versions can read which stored objects.

Every JSON object the store keeps says, in its `format` field, the lowest reader
format that can read it (as Delta Lake's `minReaderVersion` does for a table). A
reader reads every object whose format it knows, skipping fields it does not know,
and refuses the others by name: the refusal says which format the object needs and
which release wrote it, never that the data is lost. A writer uses the lowest format
that holds what it writes, so adding an optional field never raises an object's
format; only a change an older reader would misread does.

    format 1   loraserve 0.1.0 and later: JSON log entries and snapshots. 0.1.0
               reads exactly this format and refuses any other.
    format 2   loraserve 0.2.0 and later: snapshots gzip-compressed (the JSON inside
               says format 2 and the release that wrote it).

What each store may write is decided by the formats the stores on the bucket read
(compat/gate.py): a newer format is written only when no store that cannot read it
is live.
"""

from __future__ import annotations

from typing import Any

from loraserve.common.errors import FailedPrecondition
from loraserve.common.release import RELEASE

# The newest format this release reads and may write.
READ_FORMAT = 2
# The format loraserve 0.1.0 reads (and nothing else): what a store writes while one
# may be live on the bucket.
OLDEST_FORMAT = 1


class UnsupportedFormat(FailedPrecondition):
    """A stored object needs a newer reader than this store: upgrade it (or, after a
    downgrade, have a newer store write the older format again)."""


def check_readable(data: dict[str, Any], what: str, *, unstated: int | None = None) -> int:
    """The object's format, when this release can read it; UnsupportedFormat naming
    the format (and the release that wrote it) when it cannot. `unstated` is the format
    of an object kind 0.1.0 wrote without saying one."""
    found = data.get("format", unstated)
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        raise UnsupportedFormat(f"{what} has no valid format: {found!r}")
    if found > READ_FORMAT:
        writer = data.get("writer")
        by = f" (written by loraserve {writer})" if isinstance(writer, str) and writer else ""
        raise UnsupportedFormat(
            f"{what} needs storage format {found}{by}; loraserve {RELEASE} reads formats "
            f"up to {READ_FORMAT}: run a newer store, or have one write format "
            f"{READ_FORMAT} again (--storage-format {READ_FORMAT})"
        )
    return found


def check_write_format(value: int) -> int:
    """A format this release can write, else ValueError naming the ones it can."""
    if not OLDEST_FORMAT <= value <= READ_FORMAT:
        raise ValueError(f"storage format {value} is not one of {OLDEST_FORMAT}..{READ_FORMAT}")
    return value
