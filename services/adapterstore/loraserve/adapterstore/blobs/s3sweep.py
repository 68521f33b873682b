"""Start-up sweep of what interrupted pushes left in the bucket.

A push aborts its uploads on every failure, cancellation included (push.py), but
a process killed mid-push cannot: its incomplete multipart uploads (invisible, yet
billed) and staged `tmp/` objects stay. At start-up the store deletes those older
than `--stale-upload-age`: far older than any push in progress on another store
replica, so only leftovers go. A production bucket may also expire them with a
lifecycle rule; the sweep makes the store clean up without one.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loraserve.adapterstore.blobs.s3blobs import S3BlobStore

log = logging.getLogger(__name__)

TMP_PREFIX = "tmp/"


def stale_multipart_uploads(store: S3BlobStore, cutoff: datetime) -> list[tuple[str, str]]:
    """(bucket key, upload id) of every multipart upload under the store's prefix
    started before `cutoff` and with no part sent since. Blocking.

    The parts are asked for too: an upload is in use while parts arrive, and some
    S3 emulators (moto) report one fixed `Initiated` date for every upload."""
    kwargs: dict[str, Any] = {"Bucket": store.bucket, "Prefix": store.full_key("")}
    stale: list[tuple[str, str]] = []
    for page in store.client.get_paginator("list_multipart_uploads").paginate(**kwargs):
        for upload in page.get("Uploads", []):
            key, upload_id = upload["Key"], upload["UploadId"]
            if upload["Initiated"] < cutoff and not _part_since(store, key, upload_id, cutoff):
                stale.append((key, upload_id))
    return stale


def _part_since(store: S3BlobStore, key: str, upload_id: str, cutoff: datetime) -> bool:
    parts = store.client.get_paginator("list_parts")
    return any(
        part["LastModified"] >= cutoff
        for page in parts.paginate(Bucket=store.bucket, Key=key, UploadId=upload_id)
        for part in page.get("Parts", [])
    )


def stale_tmp_keys(store: S3BlobStore, cutoff: datetime) -> list[str]:
    """Store keys of the staged `tmp/` objects last written before `cutoff`. Blocking."""
    prefix = store.full_key("")
    paginator = store.client.get_paginator("list_objects_v2")
    return [
        item["Key"][len(prefix) :]
        for page in paginator.paginate(Bucket=store.bucket, Prefix=store.full_key(TMP_PREFIX))
        for item in page.get("Contents", [])
        if item["LastModified"] < cutoff
    ]


async def sweep_stale_uploads(store: S3BlobStore, cutoff: datetime) -> int:
    """Aborts the multipart uploads and deletes the `tmp/` objects left before
    `cutoff`; returns how many."""
    uploads = await store.call("list_multipart_uploads", stale_multipart_uploads, store, cutoff)
    for key, upload_id in uploads:
        await store.call(
            "abort_multipart_upload",
            store.client.abort_multipart_upload,
            Bucket=store.bucket,
            Key=key,
            UploadId=upload_id,
        )
        log.info("blob.stale_upload_aborted key=%s", key)
    staged = await store.call("list_objects_v2", stale_tmp_keys, store, cutoff)
    await store.delete(staged)
    if uploads or staged:
        log.info("blob.stale_uploads_swept uploads=%d staged=%d", len(uploads), len(staged))
    return len(uploads) + len(staged)
