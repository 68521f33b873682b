"""The start-up check that object storage honours conditional puts.

The change log's commit *is* a put with `If-None-Match: *`. On a backend that
ignores that header, two store replicas both "win" the same seq, overwrite each
other's entries and diverge for good, so a store refuses to start there.

The probe costs one or two requests and leaves exactly one small object,
PROBE_KEY, which later probes reuse: if a conditional put of it is refused, the
backend honours the header (the key exists from an earlier start); if it is
accepted, a second conditional put of the same key must be refused.
"""

from __future__ import annotations

import logging

from loraserve.adapterstore.blobs.blobstore import BlobStore
from loraserve.common.errors import FailedPrecondition

log = logging.getLogger(__name__)

PROBE_PREFIX = "probes/"
PROBE_KEY = f"{PROBE_PREFIX}if-none-match"
_PROBE_BODY = b"written by the adapter store's start-up check of If-None-Match: *\n"


async def check_conditional_put(blobs: BlobStore) -> None:
    """Raises FailedPrecondition when storage accepts a conditional put of a key
    that exists."""
    if not await blobs.put_if_absent(PROBE_KEY, _PROBE_BODY):
        return
    if await blobs.put_if_absent(PROBE_KEY, _PROBE_BODY):
        log.error("storage.conditional_put_ignored key=%s", PROBE_KEY)
        raise FailedPrecondition(
            "object storage ignores If-None-Match: * on PUT (a conditional put of an "
            f"existing key, {PROBE_KEY}, succeeded); store replicas would overwrite each "
            "other's commits and diverge, so the store does not start. Use S3 or an "
            "S3-compatible service that supports conditional writes"
        )
