"""The store's incarnation: an id made once for a bucket (and prefix).

Seqs count within one incarnation. A bucket emptied and started afresh begins
again at seq 1, so a client's seq alone cannot tell it that the store it follows
is another one now; the incarnation can. The first store replica to start on a
bucket without one writes it with `If-None-Match: *`, so replicas that start
together agree on one id (a replica that loses the race, or whose put's reply was
lost, reads the winner's). A running replica looks at it again now and then (see
changelog), so a bucket emptied under it is noticed too.
"""

from __future__ import annotations

import json
import logging
import uuid

from loraserve.adapterstore.blobs import BlobNotFound, BlobStore
from loraserve.adapterstore.catalog import now
from loraserve.adapterstore.compat.formats import OLDEST_FORMAT, check_readable
from loraserve.common.errors import DataLoss

log = logging.getLogger(__name__)

INCARNATION_KEY = "incarnation.json"


async def read_incarnation(blobs: BlobStore) -> str | None:
    """The bucket's incarnation id; None when it has none (never started, or emptied)."""
    try:
        data = await blobs.get(INCARNATION_KEY)
    except BlobNotFound:
        return None
    try:
        document = json.loads(data)
        if not isinstance(document, dict):
            raise TypeError("not a JSON object")
        check_readable(document, INCARNATION_KEY, unstated=OLDEST_FORMAT)
        value = document["incarnation"]
    except (ValueError, KeyError, TypeError) as e:
        raise DataLoss(f"{INCARNATION_KEY} is corrupt: {e}") from e
    if not isinstance(value, str) or not value:
        raise DataLoss(f"{INCARNATION_KEY} holds no incarnation id")
    return value


async def ensure_incarnation(blobs: BlobStore) -> str:
    """The bucket's incarnation id, made now if it has none."""
    found = await read_incarnation(blobs)
    if found is not None:
        return found
    made = uuid.uuid4().hex
    document = {"format": OLDEST_FORMAT, "incarnation": made, "create_time": now().isoformat()}
    if await blobs.put_if_absent(INCARNATION_KEY, json.dumps(document).encode()):
        log.info("store.incarnation_created incarnation=%s", made)
        return made
    found = await read_incarnation(blobs)
    if found is None:
        raise DataLoss(f"{INCARNATION_KEY} was taken but cannot be read back")
    return found


async def current_incarnation(blobs: BlobStore, known: str) -> str:
    """The bucket's incarnation now: `known` while the bucket still holds it, else
    the one it holds, made now if it has none (it was emptied)."""
    found = await read_incarnation(blobs)
    if found == known:
        return known
    return found if found is not None else await ensure_incarnation(blobs)
