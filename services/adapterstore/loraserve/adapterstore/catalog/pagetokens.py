"""Page sizes and page tokens of the store's listings.

Tokens are opaque to clients (URL-safe base64) and strict: only what the store
itself writes decodes, so a hand-made or mangled token is INVALID_ARGUMENT, never a
silently different page. A ListAdapters token carries the listing's seq (the first
page's, at least 1: an empty store has no second page) and the last name listed, so
every page of one listing can be answered at that seq or later, by any replica. A
ListRevisions token carries the adapter's name and the last revision listed, so it
pages only the adapter it was made for.
"""

from __future__ import annotations

import base64
import binascii

from loraserve.common.errors import InvalidArgument

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def page_size(requested: int) -> int:
    if requested < 0:
        raise InvalidArgument(f"page_size must not be negative, got {requested}")
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def _positive(text: str) -> int | None:
    """`text` as the store writes a positive number (ASCII digits, no sign, no
    leading zero, no spaces or underscores, which int() would all accept); else None."""
    if not (text.isascii() and text.isdigit()) or text.startswith("0"):
        return None
    return int(text)


def decode_listing_token(token: str) -> tuple[int, str, str]:
    """(the listing's seq, the store incarnation it counts in, the last name listed);
    (0, "", "") for the first page."""
    value = decode_token(token, "ListAdapters")
    if not value:
        return 0, "", ""
    parts = value.split(":", 2)
    seq = _positive(parts[0])
    if len(parts) != 3 or seq is None or not parts[1] or not parts[2]:
        raise InvalidArgument("invalid page_token for ListAdapters")
    return seq, parts[1], parts[2]


def encode_listing_token(seq: int, incarnation: str, last_name: str) -> str:
    return encode_token(f"{seq}:{incarnation}:{last_name}")


def decode_revisions_token(token: str, name: str) -> int:
    """The revision the next page lists below; 0 for the first page. A token made
    for another adapter is refused."""
    value = decode_token(token, "ListRevisions")
    if not value:
        return 0
    token_name, sep, revision_text = value.rpartition(":")
    revision = _positive(revision_text)
    if not sep or revision is None:
        raise InvalidArgument("invalid page_token for ListRevisions")
    if token_name != name:
        raise InvalidArgument(
            "page_token for ListRevisions was made for another adapter; list from the first page"
        )
    return revision


def encode_revisions_token(name: str, last_revision: int) -> str:
    return encode_token(f"{name}:{last_revision}")


def encode_token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode()


def decode_token(token: str, method: str) -> str:
    if not token:
        return ""
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidArgument(f"invalid page_token for {method}") from None
