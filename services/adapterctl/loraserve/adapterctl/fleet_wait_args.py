"""`--wait`'s value, parsed where the command line is (without the store's protos)."""

from __future__ import annotations


def parse_wanted(text: str) -> int | None:
    """`all` (None: every live replica) or a positive number of replicas."""
    if text == "all":
        return None
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"--wait takes 'all' or a number of replicas >= 1, got {text!r}")
    return int(text)
