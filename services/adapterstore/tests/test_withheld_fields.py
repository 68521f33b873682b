"""A bucket an older store left with a field over today's limits (a 15 MiB signature
committed under policy off) is served without that field, the revision marked, so
every client reads it again within gRPC's default 4 MiB receive limit. On a real store
over S3 HTTP (moto); the old entry is written straight into S3."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from loraserve.adapterstore.catalog.withheld import within_limits
from loraserve.adapterstore.changelog.logstorage import snapshot_key
from loraserve.adapterstore.changelog.logtypes import LogSettings
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.config.textlimits import (
    MAX_BASE_MODEL_BYTES,
    MAX_DESCRIPTION_BYTES,
    MAX_TARGET_MODULES_BYTES,
)
from loraserve.common.errors import FailedPrecondition
from loraserve.common.revisions.manifest import revision_from_proto
from loraserve.common.trust.policy import RevisionTrust, SignaturePolicy, TrustSettings
from loraserve.common.trust.signers import parse_trusted_signers
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.adapters.signers import KeyPair
from loraserve.testing.fakes.engine import fake_manifest
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.old_store import write_old_push
from loraserve.testing.store.server import StoreServer, serve_store
from loraserve.testing.waiting import eventually

MIB = 1024 * 1024
# What the old store kept: a 15 MiB signature, over gRPC's default receive limit alone.
HUGE_SIGNATURE = b"s" * (15 * MIB)


def _stored(bucket: S3Bucket, key: str) -> bool:
    keys = bucket.keys()
    return key in keys


@pytest.fixture
async def server(s3_bucket: S3Bucket) -> AsyncIterator[StoreServer]:
    """A store (its client with gRPC's default limits) started on a bucket whose log
    holds alpha@2 with a 15 MiB signature."""
    await write_old_push(s3_bucket, signature=HUGE_SIGNATURE, signed_by="ci")
    async with serve_store(s3_bucket) as running:
        yield running


async def test_get_adapter_serves_the_revision_without_its_oversized_signature(
    server: StoreServer,
) -> None:
    got = await server.stub.GetAdapter(pb.GetAdapterRequest(name="alpha"), timeout=30)
    assert got.revision.revision == 2
    assert got.revision.signature == b""
    assert got.revision.signed_by == ""
    assert list(got.revision.withheld_fields) == ["signature"]
    assert list(got.adapter.current.withheld_fields) == ["signature"]


async def test_list_adapters_lists_the_adapter_with_the_withheld_mark(
    server: StoreServer,
) -> None:
    page = await server.stub.ListAdapters(pb.ListAdaptersRequest(), timeout=30)
    assert [a.name for a in page.adapters] == ["alpha"]
    assert page.adapters[0].current.signature == b""
    assert list(page.adapters[0].current.withheld_fields) == ["signature"]


async def test_list_revisions_lists_both_revisions_marking_only_the_oversized_one(
    server: StoreServer,
) -> None:
    page = await server.stub.ListRevisions(pb.ListRevisionsRequest(name="alpha"), timeout=30)
    assert [(r.revision, list(r.withheld_fields)) for r in page.revisions] == [
        (2, ["signature"]),
        (1, []),
    ]


async def test_watch_adapters_delivers_the_old_entry_without_its_signature(
    server: StoreServer,
) -> None:
    events: list[pb.AdapterEvent] = []
    call = server.stub.WatchAdapters(pb.WatchAdaptersRequest(after_seq=0), timeout=30)
    async for message in call:
        if message.HasField("event"):
            events.append(message.event)
        if len(events) == 2:
            break
    call.cancel()
    assert [e.seq for e in events] == [1, 2]
    assert events[1].revision.signature == b""
    assert list(events[1].revision.withheld_fields) == ["signature"]


async def test_withholding_is_logged_as_a_named_event_with_the_sizes(
    s3_bucket: S3Bucket, caplog: pytest.LogCaptureFixture
) -> None:
    await write_old_push(s3_bucket, signature=HUGE_SIGNATURE)
    with caplog.at_level(logging.WARNING, logger="loraserve.adapterstore.catalog.withheld"):
        async with serve_store(s3_bucket):
            pass
    assert (
        f"catalog.field_withheld adapter=alpha revision=2 field=signature size={15 * MIB} "
        "limit=65536"
    ) in caplog.messages


async def test_a_replica_requiring_signatures_refuses_a_revision_whose_signature_was_withheld(
    server: StoreServer, ci_key: KeyPair
) -> None:
    got = await server.stub.GetAdapter(pb.GetAdapterRequest(name="alpha"), timeout=30)
    trust = RevisionTrust(
        TrustSettings(SignaturePolicy.REQUIRE, parse_trusted_signers(str(ci_key.public)))
    )
    with pytest.raises(FailedPrecondition, match="not signed"):
        trust.check_revision(revision_from_proto(got.revision))


async def test_a_snapshot_holding_an_oversized_description_is_served_without_it(
    s3_bucket: S3Bucket,
) -> None:
    await write_old_push(s3_bucket, snapshot=True, description="d" * (6 * MIB))
    async with serve_store(s3_bucket) as server:
        got = await server.stub.GetAdapter(pb.GetAdapterRequest(name="alpha"), timeout=30)
        page = await server.stub.ListAdapters(pb.ListAdaptersRequest(), timeout=30)
    assert (got.revision.description, list(got.revision.withheld_fields)) == ("", ["description"])
    assert list(page.adapters[0].current.withheld_fields) == ["description"]


async def test_the_next_snapshot_keeps_the_revision_as_served(s3_bucket: S3Bucket) -> None:
    await write_old_push(s3_bucket, description="d" * (MAX_DESCRIPTION_BYTES + 1))
    every_commit = LogSettings(poll_interval=0.05, snapshot_every=1, log_retention=0)
    async with serve_store(s3_bucket, every_commit) as server:
        await server.stub.PushAdapter(push_requests("beta", tiny_adapter()), timeout=60)
        await eventually(lambda: _stored(s3_bucket, snapshot_key(3)), "snapshot 3 written")
    body = s3_bucket.client().get_object(Bucket=s3_bucket.bucket, Key=snapshot_key(3))["Body"]
    alpha = next(a for a in json.loads(body.read())["adapters"] if a["name"] == "alpha")
    kept = next(r for r in alpha["revisions"] if r["revision"] == 2)
    assert (kept["description"], kept["withheld_fields"]) == ("", ["description"])


async def test_a_push_after_recovery_commits_the_next_revision_with_every_field(
    server: StoreServer,
) -> None:
    note = "fine"
    pushed = await server.stub.PushAdapter(
        push_requests("alpha", tiny_adapter(seed=1), description=note), timeout=60
    )
    assert (pushed.revision.revision, pushed.revision.description) == (3, note)
    assert list(pushed.revision.withheld_fields) == []


def test_each_field_over_its_limit_is_withheld_and_the_rest_kept() -> None:
    stored = replace(
        fake_manifest("alpha", 1),
        base_model="m" * (MAX_BASE_MODEL_BYTES + 1),
        target_modules=("t" * 200,) * (MAX_TARGET_MODULES_BYTES // 200 + 1),
        description="fine",
    )
    served = within_limits(stored)
    assert (served.base_model, served.target_modules) == ("", ())
    assert served.withheld_fields == ("base_model", "target_modules")
    assert served.description == "fine"
    assert within_limits(served) is served
