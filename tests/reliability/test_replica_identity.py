"""Each replica speaks for itself: a replica's credential, a named token or a client
certificate with its SPIFFE-style URI, lets it report only about the replica it names.
Before this, one replica token could make up `ghost` replicas that ACK a push, NACK a
rollout or keep a dead replica looking live.

Real store servers over real gRPC and S3 over HTTP (moto); the mTLS store is a process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, Token, secure_channel
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.certs import CertFiles, issue_uri_client_cert, make_certs
from loraserve.testing.processes.services import store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import rpc_code
from loraserve.testing.store.server import running_store
from loraserve.testing.store.statuses import report_request, routed

pytestmark = pytest.mark.faults

WRITER = "writer-secret"
REPLICA_0 = "replica-0-secret"

StubFactory = Callable[[str | None], Any]


@pytest.fixture
async def stub_for(s3_bucket: S3Bucket) -> AsyncIterator[StubFactory]:
    """Stubs sending the given token to a store holding `served@1`, whose one replica
    token names replica `inference-0`."""
    security = ServerSecurity(
        writer_tokens=(Token("ci", WRITER),),
        replica_tokens=(Token("inference-0", REPLICA_0),),
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


async def _replicas(stub: Any) -> list[str]:
    statuses = await stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="served"))
    return sorted(s.replica_id for s in statuses.statuses)


async def test_replica_token_may_report_for_the_replica_it_names(stub_for: StubFactory) -> None:
    replica = stub_for(REPLICA_0)
    code = await rpc_code(
        replica.ReportReplicaStatus(report_request("inference-0", {"served": routed(1)}))
    )
    assert code == grpc.StatusCode.OK
    assert await _replicas(stub_for(WRITER)) == ["inference-0"]


async def test_replica_token_cannot_report_status_for_made_up_replicas(
    stub_for: StubFactory,
) -> None:
    replica = stub_for(REPLICA_0)
    codes = [
        await rpc_code(replica.ReportReplicaStatus(report_request(ghost, {"served": routed(1)})))
        for ghost in ("ghost1", "ghost2")
    ]
    assert codes == [grpc.StatusCode.PERMISSION_DENIED] * 2
    assert await _replicas(stub_for(WRITER)) == []


async def test_replica_token_cannot_keep_another_replica_alive(stub_for: StubFactory) -> None:
    request = pb.ReportReplicaAliveRequest(replica_id="inference-1")
    code = await rpc_code(stub_for(REPLICA_0).ReportReplicaAlive(request))
    assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_refusal_names_both_replicas(stub_for: StubFactory) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub_for(REPLICA_0).ReportReplicaAlive(
            pb.ReportReplicaAliveRequest(replica_id="ghost1")
        )
    assert "'inference-0'" in str(refused.value.details())
    assert "'ghost1'" in str(refused.value.details())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


@asynccontextmanager
async def _stub(address: str, certs: CertFiles, client: tuple[Path, Path]) -> AsyncIterator[Any]:
    """A stub over a channel held open for the block: a channel nothing refers to is
    closed when it is collected, and a stub alone does not keep it (grpc.aio)."""
    security = ClientSecurity(
        tls_ca_file=certs.ca_cert, tls_cert_file=client[0], tls_key_file=client[1]
    )
    async with secure_channel(address, security) as channel:
        yield pb_grpc.AdapterStoreServiceStub(channel)


@pytest.fixture(scope="module")
async def mtls_store(
    module_s3_bucket: S3Bucket, certs: CertFiles, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    """A store process wanting client certificates and no token: certificates are the
    only credentials, and only a replica's names someone to report for."""
    log = tmp_path_factory.mktemp("mtls") / "store-mtls.log"
    client = (certs.client_cert, certs.client_key)

    def channel(address: str) -> grpc.aio.Channel:
        security = ClientSecurity(
            tls_ca_file=certs.ca_cert, tls_cert_file=client[0], tls_key_file=client[1]
        )
        return secure_channel(address, security)

    async with store_process(
        module_s3_bucket, log, extra=certs.mtls_flags(), channel=channel
    ) as store:
        async with _stub(store.address, certs, client) as stub:
            await stub.PushAdapter(push_requests("served", tiny_adapter()))
        yield store.address


@pytest.mark.slow
async def test_replica_certificate_reports_for_its_own_uri_only(
    mtls_store: str, certs: CertFiles, tmp_path: Path
) -> None:
    client = issue_uri_client_cert(certs, "spiffe://loraserve/replica/inference-7", tmp_path)
    async with _stub(mtls_store, certs, client) as stub:
        own = await rpc_code(stub.ReportReplicaStatus(report_request("inference-7", {})))
        other = await rpc_code(stub.ReportReplicaStatus(report_request("inference-8", {})))
        assert (own, other) == (grpc.StatusCode.OK, grpc.StatusCode.PERMISSION_DENIED)


@pytest.mark.slow
async def test_certificate_that_names_no_replica_cannot_report(
    mtls_store: str, certs: CertFiles
) -> None:
    async with _stub(mtls_store, certs, (certs.client_cert, certs.client_key)) as stub:
        code = await rpc_code(
            stub.ReportReplicaAlive(pb.ReportReplicaAliveRequest(replica_id="r1"))
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.slow
async def test_certificate_under_another_uri_prefix_cannot_report(
    mtls_store: str, certs: CertFiles, tmp_path: Path
) -> None:
    client = issue_uri_client_cert(certs, "spiffe://elsewhere/replica/inference-7", tmp_path)
    async with _stub(mtls_store, certs, client) as stub:
        code = await rpc_code(stub.ReportReplicaStatus(report_request("inference-7", {})))
        assert code == grpc.StatusCode.PERMISSION_DENIED


@pytest.mark.slow
async def test_replica_certificate_cannot_change_what_is_served(
    mtls_store: str, certs: CertFiles, tmp_path: Path
) -> None:
    client = issue_uri_client_cert(certs, "spiffe://loraserve/replica/inference-7", tmp_path)
    async with _stub(mtls_store, certs, client) as stub:
        deleted = await rpc_code(stub.DeleteAdapter(pb.DeleteAdapterRequest(name="served")))
        listed = await stub.ListAdapters(pb.ListAdaptersRequest())
        assert deleted == grpc.StatusCode.PERMISSION_DENIED
        assert [a.name for a in listed.adapters] == ["served"]
