"""Idempotency keys of write requests.

A client sends one key per intended change and the same key on every retry of it.
The change made for a key records the key and a digest of the request; the
change log answers a repeated key with that change (see ChangeLog.commit). A key
sent again with a different request is refused, never silently re-bound.
"""

from __future__ import annotations

import hashlib
import json
import re

from loraserve.adapterstore.changelog.logtypes import RequestTag
from loraserve.adapterstore.files import PushHeader
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.manifest import FileInfo

# Clients send a UUID; the limit keeps keys small in every log entry and snapshot.
_IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def check_idempotency_key(key: str) -> None:
    if key and not _IDEMPOTENCY_KEY.fullmatch(key):
        raise InvalidArgument(
            "idempotency_key must be 1 to 128 characters of letters, digits and ._:- "
            f"(a UUID, say); got {key[:64]!r}{'...' if len(key) > 64 else ''}"
        )


def request_tag(key: str, *request: object) -> RequestTag | None:
    """The key with a digest of everything the request asks for, so the key reused
    for another request is told apart from a retry."""
    if not key:
        return None
    canonical = json.dumps(request, separators=(",", ":"), sort_keys=True)
    return RequestTag(key, hashlib.sha256(canonical.encode()).hexdigest())


def push_request_tag(header: PushHeader, files: tuple[FileInfo, ...]) -> RequestTag | None:
    """What a push asks for, as its idempotency key's digest covers it: the header's
    name, flags and description with each file's name, size and sha256 (and the
    signature's digest, for a signed push)."""
    request: list[object] = [
        "push",
        header.name,
        [f.to_json() for f in files],
        header.no_promote,
        header.description,
    ]
    if header.signature:
        request.append(hashlib.sha256(header.signature).hexdigest())
    return request_tag(header.idempotency_key, *request)
