"""Which store versions may share a bucket: the storage formats each reads and
writes, and the stores' announcements of themselves that decide what is written.
The gate that decides (`compat.gate`) is imported from its module: it reads the
replicas' reports, which this package's users must not depend on."""

from loraserve.adapterstore.compat.formats import (
    OLDEST_FORMAT,
    READ_FORMAT,
    UnsupportedFormat,
    check_readable,
    check_write_format,
)

__all__ = [
    "OLDEST_FORMAT",
    "READ_FORMAT",
    "UnsupportedFormat",
    "check_readable",
    "check_write_format",
]
