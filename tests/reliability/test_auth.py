"""Row 9: bearer tokens with reader and writer roles, and mTLS, on the real servers.

Missing or wrong tokens are UNAUTHENTICATED, a reader token on a write RPC is
PERMISSION_DENIED and writes nothing; health stays open to load balancers. Under
mTLS a client without a certificate signed by the configured CA never completes
the handshake (UNAVAILABLE), one with such a certificate is served.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.clientstream import stream_unary
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, Token, secure_channel
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.certs import CertFiles, make_certs
from loraserve.testing.processes.services import health_status, store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import rpc_code as _code
from loraserve.testing.store.server import RunningStore, running_store

pytestmark = pytest.mark.faults

READER = "reader-secret"
WRITER = "writer-secret"
ADMIN = "admin-secret"

StubFactory = Callable[[str | None], Any]


@pytest.fixture(scope="module")
async def secured_store(module_s3_bucket: S3Bucket) -> AsyncIterator[RunningStore]:
    """A store that wants tokens, shared: each test here is refused, reads, or writes
    only adapter `seeded`."""
    security = ServerSecurity(
        reader_tokens=(Token("inference", READER),),
        writer_tokens=(Token("ci", WRITER),),
        admin_tokens=(Token("oncall", ADMIN),),
    )
    async with running_store(module_s3_bucket, security=security) as store:
        yield store


@pytest.fixture
async def stub_for(secured_store: RunningStore) -> AsyncIterator[StubFactory]:
    """Stubs on channels that send the given token (None: no token)."""
    channels: list[grpc.aio.Channel] = []

    def make(token: str | None) -> Any:
        channel = secure_channel(secured_store.address, ClientSecurity(token=token))
        channels.append(channel)
        return pb_grpc.AdapterStoreServiceStub(channel)

    yield make
    for channel in channels:
        await channel.close()


def _write_call(stub: Any, call: str) -> Any:
    if call == "push":
        return stream_unary(stub.PushAdapter, push_requests("authz", tiny_adapter()))
    if call == "set-current":
        return stub.SetCurrentRevision(pb.SetCurrentRevisionRequest(name="seeded", revision=1))
    if call == "rollout":
        return stub.StartRollout(pb.StartRolloutRequest(name="seeded", revision=2, weight=0.5))
    if call == "yank":
        return stub.YankRevision(pb.YankRevisionRequest(name="seeded", revision=1, reason="bad"))
    if call == "quota":
        quota = pb.AdapterQuota(max_in_flight=1)
        return stub.SetQuota(pb.SetQuotaRequest(adapter_name="seeded", quota=quota))
    return stub.DeleteAdapter(pb.DeleteAdapterRequest(name="seeded"))


async def _seed(stub_for: StubFactory) -> None:
    await stub_for(WRITER).PushAdapter(push_requests("seeded", tiny_adapter()))


async def test_store_call_without_a_token_is_unauthenticated(stub_for: StubFactory) -> None:
    assert await _code(stub_for(None).ListAdapters(pb.ListAdaptersRequest())) == (
        grpc.StatusCode.UNAUTHENTICATED
    )


async def test_store_call_with_a_wrong_token_is_unauthenticated(stub_for: StubFactory) -> None:
    assert await _code(stub_for("guess").ListAdapters(pb.ListAdaptersRequest())) == (
        grpc.StatusCode.UNAUTHENTICATED
    )


async def test_store_streaming_calls_without_a_token_are_unauthenticated(
    stub_for: StubFactory,
) -> None:
    stub = stub_for(None)
    push = await _code(stream_unary(stub.PushAdapter, push_requests("anon", tiny_adapter())))
    watch = stub.WatchAdapters(pb.WatchAdaptersRequest())
    watched = await _code(watch.read())
    assert (push, watched) == (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED)


@pytest.mark.parametrize("call", ["push", "set-current", "delete"])
async def test_reader_token_on_a_write_call_is_permission_denied_and_writes_nothing(
    call: str, stub_for: StubFactory, secured_store: RunningStore
) -> None:
    await _seed(stub_for)
    before = secured_store.bucket.keys()
    code = await _code(_write_call(stub_for(READER), call))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert secured_store.bucket.keys() == before


@pytest.mark.parametrize("call", ["set-current", "delete", "rollout", "quota", "yank"])
async def test_writer_token_on_an_admin_call_is_permission_denied_and_writes_nothing(
    call: str, stub_for: StubFactory, secured_store: RunningStore
) -> None:
    await _seed(stub_for)
    before = secured_store.bucket.keys()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _write_call(stub_for(WRITER), call)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "needs an admin token" in str(refused.value.details())
    assert secured_store.bucket.keys() == before


async def test_admin_token_may_push_set_current_and_delete(stub_for: StubFactory) -> None:
    admin = stub_for(ADMIN)
    await stream_unary(admin.PushAdapter, push_requests("admin-made", tiny_adapter()))
    request = pb.SetCurrentRevisionRequest(name="admin-made", revision=1)
    await admin.SetCurrentRevision(request)
    await admin.DeleteAdapter(pb.DeleteAdapterRequest(name="admin-made"))
    listed = await stub_for(READER).ListAdapters(pb.ListAdaptersRequest())
    assert "admin-made" not in [a.name for a in listed.adapters]


async def test_writer_token_may_write_and_reader_token_may_read(stub_for: StubFactory) -> None:
    await _seed(stub_for)
    listed = await stub_for(READER).ListAdapters(pb.ListAdaptersRequest())
    revisions = await stub_for(READER).ListRevisions(pb.ListRevisionsRequest(name="seeded"))
    assert [a.name for a in listed.adapters] == ["seeded"]
    assert {r.pushed_by for r in revisions.revisions} == {"ci"}


async def test_download_urls_need_a_reader_token(stub_for: StubFactory) -> None:
    await _seed(stub_for)
    request = pb.GetDownloadUrlsRequest(name="seeded")
    anonymous = await _code(stub_for(None).GetDownloadUrls(request))
    answer = await stub_for(READER).GetDownloadUrls(request)
    assert anonymous == grpc.StatusCode.UNAUTHENTICATED
    assert [u.file_name for u in answer.urls] == [f.name for f in answer.manifest.files]
    assert all(u.url.startswith("http") for u in answer.urls)


async def test_health_needs_no_token(secured_store: RunningStore) -> None:
    assert await health_status(secured_store.address) == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def other_ca_certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("other-ca"))


def _tls_channel(certs: CertFiles, client: CertFiles | None) -> Callable[[str], grpc.aio.Channel]:
    security = ClientSecurity(
        tls_ca_file=certs.ca_cert,
        tls_cert_file=client.client_cert if client else None,
        tls_key_file=client.client_key if client else None,
    )
    return lambda address: secure_channel(address, security)


@pytest.fixture(scope="module")
async def mtls_store(
    module_s3_bucket: S3Bucket, certs: CertFiles, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    """A store process that wants client certificates; the tests here only connect."""
    log = tmp_path_factory.mktemp("mtls") / "store-mtls.log"
    async with store_process(
        module_s3_bucket, log, extra=certs.mtls_flags(), channel=_tls_channel(certs, certs)
    ) as store:
        yield store.address


async def _list_code(channel: grpc.aio.Channel) -> grpc.StatusCode:
    async with channel:
        stub = pb_grpc.AdapterStoreServiceStub(channel)
        return await _code(stub.ListAdapters(pb.ListAdaptersRequest(), timeout=5))


@pytest.mark.slow
async def test_mtls_client_with_a_certificate_from_the_ca_is_served(
    mtls_store: str, certs: CertFiles
) -> None:
    assert await _list_code(_tls_channel(certs, certs)(mtls_store)) == grpc.StatusCode.OK


@pytest.mark.slow
async def test_mtls_client_without_a_certificate_fails_the_handshake(
    mtls_store: str, certs: CertFiles
) -> None:
    code = await _list_code(_tls_channel(certs, None)(mtls_store))
    assert code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.slow
async def test_mtls_client_with_a_certificate_from_another_ca_fails_the_handshake(
    mtls_store: str, certs: CertFiles, other_ca_certs: CertFiles
) -> None:
    code = await _list_code(_tls_channel(certs, other_ca_certs)(mtls_store))
    assert code == grpc.StatusCode.UNAVAILABLE


@pytest.mark.slow
async def test_plaintext_client_of_an_mtls_store_is_unavailable(mtls_store: str) -> None:
    assert await _list_code(grpc.aio.insecure_channel(mtls_store)) == grpc.StatusCode.UNAVAILABLE
