"""Page sizes and page tokens of the store's listings.

Tokens are opaque to clients (URL-safe base64). A ListAdapters token carries the
listing's seq (the first page's) and the last name listed, so every page of one
listing can be answered at that seq or later, by any replica.
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


def decode_listing_token(token: str) -> tuple[int, str]:
    """(the listing's seq, the last name listed); (0, "") for the first page."""
    value = decode_token(token, "ListAdapters")
    if not value:
        return 0, ""
    seq, sep, after = value.partition(":")
    if not sep or not (seq.isascii() and seq.isdigit()):
        raise InvalidArgument("invalid page_token for ListAdapters")
    return int(seq), after


def encode_token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode()


def decode_token(token: str, method: str) -> str:
    if not token:
        return ""
    try:
        return base64.b64decode(token.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidArgument(f"invalid page_token for {method}") from None


def encode_listing_token(seq: int, last_name: str) -> str:
    return encode_token(f"{seq}:{last_name}")
