"""A bucket as a store before the field limits left it: a committed revision with a field
over today's limit, written straight into S3 in the store's own log format."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from loraserve.adapterstore.catalog import Change, ChangeType, StoreState, now
from loraserve.adapterstore.changelog.logstorage import log_key, parse_change, snapshot_key
from loraserve.common.revisions.manifest import Revision
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import serve_store

OLD_ACTOR = "old-store"


def _compact(data: dict[str, Any]) -> bytes:
    # How the change log encodes entries and snapshots.
    return json.dumps(data, separators=(",", ":")).encode()


async def write_old_push(bucket: S3Bucket, snapshot: bool = False, **fields: Any) -> Revision:
    """Pushes alpha@1 through today's store, then commits alpha@2 at seq 2 as an older
    store did, unchecked: alpha@1's files with `fields` (e.g. a 15 MiB `signature`).
    With `snapshot`, writes the state folded up to seq 2 as its snapshot and deletes
    the log entries it covers, as retention does: the snapshot is then all there is to
    read. Returns alpha@2 as written."""
    async with serve_store(bucket) as server:
        await server.stub.PushAdapter(push_requests("alpha", tiny_adapter()), timeout=60)
    client = bucket.client()
    first = parse_change(client.get_object(Bucket=bucket.bucket, Key=log_key(1))["Body"].read(), 1)
    assert first.revision is not None
    time = now()
    old = replace(first.revision, revision=2, seq=2, create_time=time, **fields)
    change = Change(
        2, ChangeType.REVISION_PUSHED, "alpha", old, 2, time, OLD_ACTOR, commit_id="old-commit"
    )
    client.put_object(Bucket=bucket.bucket, Key=log_key(2), Body=_compact(change.to_json()))
    if snapshot:
        state = StoreState()
        state.apply(first)
        state.apply(change)
        client.put_object(Bucket=bucket.bucket, Key=snapshot_key(2), Body=state.encode())
        for seq in (1, 2):
            client.delete_object(Bucket=bucket.bucket, Key=log_key(seq))
    return old
