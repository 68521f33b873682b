"""What an attacker with write access to the bucket does, bypassing the store: writes
blobs and change-log entries with boto3, in the store's own formats."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.catalog.model import Change, ChangeType, now
from loraserve.adapterstore.changelog.logstorage import LOG_PREFIX, log_key
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.s3.endpoint import S3Bucket


def put_blobs(bucket: S3Bucket, files: AdapterFiles) -> tuple[FileInfo, ...]:
    """Each file at its content address, as the store would have stored it."""
    client = bucket.client()
    infos = []
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        client.put_object(Bucket=bucket.bucket, Key=blob_key(digest), Body=data)
        infos.append(FileInfo(name, len(data), digest))
    return tuple(infos)


def replace_blob(bucket: S3Bucket, sha256: str, data: bytes) -> None:
    """Other bytes under an existing blob's key."""
    bucket.client().put_object(Bucket=bucket.bucket, Key=blob_key(sha256), Body=data)


def log_entry(bucket: S3Bucket, seq: int) -> Change:
    body = bucket.client().get_object(Bucket=bucket.bucket, Key=log_key(seq))["Body"].read()
    return Change.from_json(json.loads(body))


def head_seq(bucket: S3Bucket) -> int:
    listing = bucket.client().list_objects_v2(Bucket=bucket.bucket, Prefix=LOG_PREFIX)
    keys = [o["Key"] for o in listing.get("Contents", [])]
    return max((int(k[len(LOG_PREFIX) :].split(".")[0]) for k in keys), default=0)


def forge_push(bucket: S3Bucket, revision: Revision, *, name: str | None = None) -> int:
    """Appends a log entry pushing `revision` (renamed to `name`, numbered after the
    adapter's last revision in the log) and making it current; returns its seq."""
    seq = head_seq(bucket) + 1
    name = name or revision.adapter_name
    number = 1 + max(
        (
            entry.revision.revision
            for s in range(1, seq)
            if (entry := log_entry(bucket, s)).adapter_name == name and entry.revision is not None
        ),
        default=0,
    )
    forged = replace(revision, adapter_name=name, revision=number, seq=seq, create_time=now())
    change = Change(
        seq, ChangeType.REVISION_PUSHED, name, forged, number, now(), "attacker", f"forged-{seq}"
    )
    bucket.client().put_object(
        Bucket=bucket.bucket, Key=log_key(seq), Body=json.dumps(change.to_json()).encode()
    )
    return seq
