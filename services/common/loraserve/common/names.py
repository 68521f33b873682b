"""Adapter names and references (`NAME` or `NAME@REVISION`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from loraserve.common.errors import InvalidArgument

# Lower-case ASCII only: no `/`, no `..` at the start, no unicode look-alikes, no NUL.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


def validate_adapter_name(name: str) -> str:
    """Returns `name` if it is a valid adapter name, else raises InvalidArgument."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidArgument(
            f"invalid adapter name {name!r}: must match ^[a-z0-9][a-z0-9._-]{{0,62}}$ "
            "and must not contain '..'"
        )
    return name


@dataclass(frozen=True, slots=True)
class AdapterRef:
    """What a request asks for: the base model, an adapter's current revision,
    or a pinned revision."""

    name: str  # "" for the base model
    revision: int | None = None  # None: whatever is current

    @property
    def is_base(self) -> bool:
        return not self.name

    def __str__(self) -> str:
        return self.name if self.revision is None else f"{self.name}@{self.revision}"


def parse_adapter_ref(text: str) -> AdapterRef:
    """Parses "", "NAME" or "NAME@REVISION"; raises InvalidArgument otherwise."""
    if not text:
        return AdapterRef("")
    name, sep, rev = text.partition("@")
    validate_adapter_name(name)
    if not sep:
        return AdapterRef(name)
    if not rev.isascii() or not rev.isdigit() or int(rev) < 1:
        raise InvalidArgument(
            f"invalid adapter reference {text!r}: revision must be a positive integer"
        )
    return AdapterRef(name, int(rev))
