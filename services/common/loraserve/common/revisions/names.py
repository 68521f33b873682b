"""Adapter names and references (`NAME` or `NAME@REVISION`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from loraserve.common.errors import InvalidArgument

# Lower-case ASCII only: no `/`, no `..` at the start, no unicode look-alikes, no NUL.
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
# Revisions are int64 in the protos: a larger number names no revision anywhere.
MAX_REVISION = 2**63 - 1
# Names and references are echoed in error messages only this far: a megabyte of
# name must not make a megabyte of status (gRPC refuses trailers that large).
_SHOWN_CHARS = 80


def shown(text: str) -> str:
    """`text` quoted for an error message, cut short if long."""
    if len(text) <= _SHOWN_CHARS:
        return repr(text)
    return f"{text[:_SHOWN_CHARS]!r}... ({len(text)} characters)"


def validate_adapter_name(name: str) -> str:
    """Returns `name` if it is a valid adapter name, else raises InvalidArgument."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise InvalidArgument(
            f"invalid adapter name {shown(name)}: must match ^[a-z0-9][a-z0-9._-]{{0,62}}$ "
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
    problem = _revision_problem(rev)
    if problem is not None:
        raise InvalidArgument(f"invalid adapter reference {shown(text)}: {problem}")
    return AdapterRef(name, int(rev))


def _revision_problem(rev: str) -> str | None:
    if not rev:
        return "no revision after '@' (use NAME or NAME@REVISION)"
    if "@" in rev:
        return "more than one '@' (use NAME or NAME@REVISION)"
    if not (rev.isascii() and rev.isdigit()):
        return "revision must be a positive integer"
    # Compared as text first: int() of thousands of digits is slow, then refused.
    if len(rev.lstrip("0")) > len(str(MAX_REVISION)) or int(rev) > MAX_REVISION:
        return f"revision must be at most {MAX_REVISION}"
    if int(rev) < 1:
        return "revision must be a positive integer"
    return None
