"""Writing a revision into a store's bucket around the store, as an older store, a script
or anyone with the bucket's credentials can: none of the store's push checks run.

The store's own types lay out the objects, so the entry reads exactly like one the store
committed; the store serving the bucket finds it as another replica's commit.
"""

from __future__ import annotations

import hashlib
import json
import uuid

from loraserve.adapterstore.blobs.blobstore import blob_key
from loraserve.adapterstore.catalog.model import Change, ChangeType, now
from loraserve.adapterstore.changelog.logstorage import LOG_PREFIX, log_key
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.common.revisions.peft_format import CONFIG_FILE
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.s3.endpoint import S3Bucket

ACTOR = "around-the-store"


def commit_around_the_store(bucket: S3Bucket, name: str, files: AdapterFiles) -> int:
    """Makes `files` the next, current revision of adapter `name` (which must exist)
    by writing S3 directly: the blobs at their content addresses, then the log's next
    entry with If-None-Match. Returns the revision number."""
    client = bucket.client()
    stored = bucket.keys()
    changes = [
        Change.from_json(
            json.loads(client.get_object(Bucket=bucket.bucket, Key=key)["Body"].read())
        )
        for key in stored
        if key.startswith(LOG_PREFIX)
    ]
    seq = max(change.seq for change in changes) + 1
    revision = 1 + max(
        change.revision.revision
        for change in changes
        if change.adapter_name == name and change.revision is not None
    )
    infos = []
    for file_name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        client.put_object(Bucket=bucket.bucket, Key=blob_key(digest), Body=data)
        infos.append(FileInfo(file_name, len(data), digest))
    config = json.loads(files[CONFIG_FILE])
    manifest = Revision(
        adapter_name=name,
        revision=revision,
        files=tuple(infos),
        base_model=str(config["base_model_name_or_path"]),
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        target_modules=tuple(sorted(config["target_modules"])),
        create_time=now(),
        pushed_by=ACTOR,
        description="",
        seq=seq,
    )
    change = Change(
        seq=seq,
        type=ChangeType.REVISION_PUSHED,
        adapter_name=name,
        revision=manifest,
        current_revision=revision,
        time=now(),
        actor=ACTOR,
        commit_id=uuid.uuid4().hex,
    )
    client.put_object(
        Bucket=bucket.bucket,
        Key=log_key(seq),
        Body=json.dumps(change.to_json()).encode(),
        IfNoneMatch="*",
    )
    return revision
