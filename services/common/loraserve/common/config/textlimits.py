"""Bounds on every field a caller can make the store keep and serve back, and on
listing pages: the one place they are set.

Everything the store accepts ends up in log entries, snapshots, watch events,
listing pages or replica status objects, so one oversized field would make every
later page or event that carries it too large for a gRPC message, whatever the
signature policy. Each bound is documented on its proto field; a value over it is
refused with INVALID_ARGUMENT naming the field and the limit, before anything is
stored. A revision an older store kept with a field over its bound is served without
that field (loraserve.adapterstore.catalog.withheld).
"""

from __future__ import annotations

from collections.abc import Iterable

from loraserve.common.errors import InvalidArgument

KIB = 1024
# PushHeader.description: a note, not a document (README.md travels as a file).
MAX_DESCRIPTION_BYTES = 64 * KIB
# PushHeader.signature: a key-signed bundle of a few files is under 2 KiB; a
# certificate chain adds a few KiB. Anything far larger is no signature of ours.
MAX_SIGNATURE_BYTES = 64 * KIB
# PushHeader.files: the store accepts a handful of known files (peft_format.ALLOWED_FILES);
# the bounds hold whatever that list becomes. 255 bytes is a file name on Linux.
MAX_FILES = 32
MAX_FILE_NAME_BYTES = 255
# adapter_config.json's base_model_name_or_path: a hub id or a path.
MAX_BASE_MODEL_BYTES = 1 * KIB
# adapter_config.json's target_modules: names, all together (full per-layer paths fit).
MAX_TARGET_MODULES_BYTES = 64 * KIB
MAX_TARGET_MODULE_BYTES = 256
# Every reason a caller stores: a replica's NACK reason (error.message, shown by
# `adapterctl status`) and a rollout's abort reason.
MAX_ERROR_MESSAGE_BYTES = 4 * KIB
# ReportReplicaStatusRequest's incarnation and counters_epoch: ids (a UUID), kept in
# the replica's status objects.
MAX_REPORT_ID_BYTES = 128
# A report's AdapterReport.revisions (the current one, a rollout's candidate, what
# was refused), its counters and its TTFT bucket bounds: what one status or counters
# object holds per adapter and replica.
MAX_REVISIONS_PER_ADAPTER = 4
MAX_COUNTERS = 1000
MAX_TTFT_BOUNDS = 32
# A revision counter's most recent distinct callers (RevisionCounters.callers): enough
# for any rollout's `min_callers`, which it bounds.
MAX_ROLLOUT_CALLERS = 16
# Any error message a server sends: a gRPC status message travels in the trailers, whose
# size clients cap (grpcio's default hard limit is 16 KiB for all metadata; past it the
# client sees RESOURCE_EXHAUSTED and the real status is lost), and an HTTP error body
# should stay readable. Messages that list what was wrong name a few (`few`).
MAX_STATUS_MESSAGE_BYTES = 2 * KIB
# How many offending items an error message names before it only counts the rest.
SHOWN_ITEMS = 5
MAX_ITEM_BYTES = 80
# What the store keeps of one: a GetAdapterStatus page holds one per replica and adapter.
MAX_KEPT_ERROR_MESSAGE_BYTES = 1 * KIB
# A listing page's adapters/revisions, encoded: below gRPC's default 4 MiB receive
# limit, so any client (grpcurl included) can read every page.
MAX_PAGE_BYTES = 3 * KIB * KIB


def check_text(field: str, value: str, limit: int) -> None:
    """Raises InvalidArgument when `value`, UTF-8 encoded, is longer than `limit` bytes
    or is not text at all (a lone surrogate, e.g. from a JSON `\\ud800` escape)."""
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(f"{field} is not valid Unicode text") from None
    if size > limit:
        raise InvalidArgument(f"{field} is {size} bytes; the limit is {limit} bytes")


def check_bytes(field: str, value: bytes, limit: int) -> None:
    """Raises InvalidArgument when `value` is longer than `limit` bytes."""
    if len(value) > limit:
        raise InvalidArgument(f"{field} is {len(value)} bytes; the limit is {limit} bytes")


def truncate_text(value: str, limit: int) -> str:
    """`value` cut to at most `limit` UTF-8 bytes, on a character boundary; what is not
    text (a lone surrogate) is shown escaped."""
    data = value.encode(errors="backslashreplace")
    if len(data) <= limit:
        return data.decode()
    return data[: max(0, limit - 3)].decode(errors="ignore") + "..."


def few(items: Iterable[object], shown: int = SHOWN_ITEMS) -> str:
    """The items for an error message: all of a few, else the first `shown` and a count
    (`1, 2, 3, 4, 5 and 4995 more`); each item's text cut short too."""
    listed: list[str] = []
    rest = 0
    for item in items:
        if len(listed) < shown:
            listed.append(truncate_text(str(item), MAX_ITEM_BYTES))
        else:
            rest += 1
    text = ", ".join(listed)
    return f"{text} and {rest} more" if rest else text


def capped_message(message: str) -> str:
    """`message` cut to `MAX_STATUS_MESSAGE_BYTES`, saying how much was cut: what every
    error status or HTTP error body carries, whoever wrote the message."""
    data = message.encode(errors="backslashreplace")
    if len(data) <= MAX_STATUS_MESSAGE_BYTES:
        return data.decode()
    note = f" ... ({len(data)} bytes, cut)"
    keep = MAX_STATUS_MESSAGE_BYTES - len(note)
    return data[:keep].decode(errors="ignore") + note


class PageFill:
    """Counts a page's entries and bytes; the first entry always fits, so a listing
    moves on even past an entry larger than the byte budget."""

    # Field tag and length prefix of each entry of a repeated message field.
    _ENTRY_OVERHEAD = 8

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self._room = max_entries
        self._bytes_left = max_bytes
        self._first = True

    def room_for(self, size: int) -> bool:
        size += self._ENTRY_OVERHEAD
        if self._room == 0 or (size > self._bytes_left and not self._first):
            return False
        self._first = False
        self._room -= 1
        self._bytes_left -= size
        return True
