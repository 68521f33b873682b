"""What replicas report: only replica tokens may report, what they say of adapters and
revisions the store does not hold is dropped, and statuses of replicas that went quiet
expire.

Real store servers in-process over real gRPC and S3 over HTTP (moto).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.replicas.model import shard_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, Token, secure_channel
from loraserve.common.statusshards import shard_of
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, rpc_code, store_stub
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.store.statuses import report_request, routed
from loraserve.testing.waiting import GUARD_S

pytestmark = pytest.mark.faults

READER = "reader-secret"
WRITER = "writer-secret"
REPLICA = "replica-secret"

StubFactory = Callable[[str | None], Any]


def ack(adapter: str = "served", revision: int = 1, replica: str = "inference-0") -> Any:
    """A batched report of `replica` routing `adapter`@`revision`, loaded."""
    return report_request(replica, {adapter: routed(revision)})


def alive(replica: str = "inference-0") -> Any:
    return pb.ReportReplicaAliveRequest(replica_id=replica)


@pytest.fixture
async def stub_for(s3_bucket: S3Bucket) -> AsyncIterator[StubFactory]:
    """Stubs, each sending the given token, to a store with three roles holding `served@1`."""
    security = ServerSecurity(
        reader_tokens=(Token("dashboard", READER),),
        writer_tokens=(Token("ci", WRITER),),
        replica_tokens=(Token("inference-0", REPLICA),),
    )
    channels: list[grpc.aio.Channel] = []

    def make(token: str | None) -> Any:
        channel = secure_channel(running.address, ClientSecurity(token=token))
        channels.append(channel)
        return pb_grpc.AdapterStoreServiceStub(channel)

    async with running_store(s3_bucket, security=security) as running:
        await make(WRITER).PushAdapter(push_requests("served", tiny_adapter()))
        yield make
        for channel in channels:
            await channel.close()


async def test_reader_token_cannot_report_status(stub_for: StubFactory) -> None:
    assert (
        await rpc_code(stub_for(READER).ReportReplicaStatus(ack()))
        == grpc.StatusCode.PERMISSION_DENIED
    )
    statuses = await stub_for(READER).GetAdapterStatus(pb.GetAdapterStatusRequest())
    assert list(statuses.statuses) == []


async def test_writer_token_cannot_report_status(stub_for: StubFactory) -> None:
    assert (
        await rpc_code(stub_for(WRITER).ReportReplicaStatus(ack()))
        == grpc.StatusCode.PERMISSION_DENIED
    )


async def test_replica_token_reports_and_reads_but_cannot_write(stub_for: StubFactory) -> None:
    replica = stub_for(REPLICA)
    assert await rpc_code(replica.ReportReplicaStatus(ack())) == grpc.StatusCode.OK
    assert await rpc_code(replica.ReportReplicaAlive(alive())) == grpc.StatusCode.OK
    listed = await replica.ListAdapters(pb.ListAdaptersRequest())
    pushed = replica.PushAdapter(push_requests("sneaky", tiny_adapter()))
    assert [a.name for a in listed.adapters] == ["served"]
    assert await rpc_code(pushed) == grpc.StatusCode.PERMISSION_DENIED
    statuses = await stub_for(READER).GetAdapterStatus(pb.GetAdapterStatusRequest())
    assert [(s.replica_id, s.adapter_name) for s in statuses.statuses] == [
        ("inference-0", "served")
    ]


@pytest.fixture
async def store(s3_bucket: S3Bucket) -> AsyncIterator[RunningStore]:
    async with running_store(s3_bucket) as running:
        yield running


async def test_report_about_an_adapter_that_does_not_exist_is_dropped(
    store: RunningStore,
) -> None:
    async with store_stub(store.address) as stub:
        code = await rpc_code(stub.ReportReplicaStatus(ack("never-pushed")))
        statuses = await stub.GetAdapterStatus(pb.GetAdapterStatusRequest())
    assert code == grpc.StatusCode.OK
    assert list(statuses.statuses) == []


async def test_report_of_a_revision_that_does_not_exist_keeps_only_the_real_ones(
    store: RunningStore,
) -> None:
    async with store_stub(store.address) as stub:
        await push(stub, "served", tiny_adapter())
        await stub.ReportReplicaStatus(ack("served", revision=7))
        response = await stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="served"))
    [status] = response.statuses
    assert (status.replica_id, status.serving_revision, list(status.revisions)) == (
        "inference-0",
        0,
        [],
    )


async def test_report_about_an_adapter_pushed_through_another_store_is_accepted(
    s3_bucket: S3Bucket,
) -> None:
    async with (
        running_store(s3_bucket) as a,
        running_store(s3_bucket) as b,
        store_stub(a.address) as stub_a,
        store_stub(b.address) as stub_b,
    ):
        await push(stub_a, "elsewhere", tiny_adapter())
        assert await rpc_code(stub_b.ReportReplicaStatus(ack("elsewhere"))) == grpc.StatusCode.OK


@pytest.mark.parametrize("replica_id", ["", "-leading-dash", "has/slash", "x" * 129])
async def test_malformed_replica_id_is_invalid_argument(
    store: RunningStore, replica_id: str
) -> None:
    async with store_stub(store.address) as stub:
        await push(stub, "served", tiny_adapter())
        report = await rpc_code(stub.ReportReplicaStatus(ack(replica=replica_id)))
        sign = await rpc_code(stub.ReportReplicaAlive(alive(replica_id)))
    assert (report, sign) == (grpc.StatusCode.INVALID_ARGUMENT,) * 2


async def test_deleted_adapter_leaves_the_report_of_a_live_replica_and_its_shard(
    s3_bucket: S3Bucket,
) -> None:
    async with (
        running_store(s3_bucket) as store,
        store_stub(store.address) as stub,
    ):
        await push(stub, "gone", tiny_adapter())
        await stub.ReportReplicaStatus(ack("gone"))
        before = await stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="gone"))
        await stub.DeleteAdapter(pb.DeleteAdapterRequest(name="gone"))
        # The replica's next report of that shard no longer names the adapter.
        await stub.ReportReplicaStatus(
            pb.ReportReplicaStatusRequest(
                replica_id="inference-0",
                report_interval_seconds=60,
                shards=[pb.StatusShard(index=shard_of("gone"))],
            )
        )
        after = await stub.GetAdapterStatus(pb.GetAdapterStatusRequest())
    keys = s3_bucket.keys()
    assert [(s.replica_id, s.serving_revision) for s in before.statuses] == [("inference-0", 1)]
    assert list(after.statuses) == []
    assert [k for k in keys if k.startswith("fleet/")] == []


async def test_statuses_of_a_replica_that_stopped_reporting_expire(s3_bucket: S3Bucket) -> None:
    async with (
        running_store(s3_bucket, status_ttl_s=2.0) as store,
        store_stub(store.address) as stub,
    ):
        await push(stub, "served", tiny_adapter())
        for replica in ("old-host", "new-host"):
            await stub.ReportReplicaStatus(ack(replica=replica))

        async def live_replicas() -> list[str]:
            # new-host keeps sending signs of life; old-host went away after one report.
            await stub.ReportReplicaAlive(alive("new-host"))
            response = await stub.GetAdapterStatus(pb.GetAdapterStatusRequest())
            return [s.replica_id for s in response.statuses]

        shown = await live_replicas()
        assert shown == ["new-host", "old-host"]
        async with asyncio.timeout(GUARD_S):
            while shown != ["new-host"]:
                await asyncio.sleep(0.1)
                shown = await live_replicas()
        back = await stub.ReportReplicaAlive(alive("old-host"))
    keys = s3_bucket.keys()
    assert not back.known, "a replica whose statuses expired is told to report again"
    assert [k for k in keys if k.startswith("fleet/")] == [
        shard_key(shard_of("served"), "new-host")
    ]
