"""Byte sizes: on command lines (`123`, `512MiB`, `4GiB`, `2G`, binary units), and the
gRPC message limit every loraserve server and client sets."""

from __future__ import annotations

import argparse
import re

_SIZE = re.compile(r"(\d+)\s*([KMGT]i?B?|B)?", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}

# Room for a 1 MiB file chunk plus framing, large prompts and long generations
# (gRPC's default is 4 MiB). Both directions, on both ends of every channel.
MESSAGE_LIMIT = 16 * 1024 * 1024
MESSAGE_LIMIT_OPTIONS = (
    ("grpc.max_send_message_length", MESSAGE_LIMIT),
    ("grpc.max_receive_message_length", MESSAGE_LIMIT),
)


def parse_size(text: str) -> int:
    """Bytes from `123`, `512MiB`, `4GiB`, `2G` (binary units)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MiB, 1000000)")
    unit = (match[2] or "").upper()[:1]
    return int(match[1]) * _UNITS[unit]
