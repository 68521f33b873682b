"""A server's TLS certificate renewed in place (as cert-manager or a kubelet secret
volume renews it) is what the next connection's handshake gets: no restart. Real
grpc.aio servers on 127.0.0.1 with certificates of two CAs."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, secure_channel
from loraserve.common.rpc.server import RunningServer
from loraserve.testing.certs import CertFiles, make_certs
from loraserve.testing.grpc import serving


async def _code(port: int, ca: Path) -> grpc.StatusCode:
    async with secure_channel(f"127.0.0.1:{port}", ClientSecurity(tls_ca_file=ca)) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        except grpc.aio.AioRpcError as e:
            return e.code()
    return grpc.StatusCode.OK


@pytest.fixture
def two_cas(tmp_path: Path) -> tuple[CertFiles, CertFiles]:
    return make_certs(tmp_path / "old"), make_certs(tmp_path / "new")


@pytest.fixture
async def server(
    tmp_path: Path, two_cas: tuple[CertFiles, CertFiles]
) -> AsyncIterator[tuple[RunningServer, Path]]:
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(two_cas[0].server_cert, live / "tls.crt")
    shutil.copy(two_cas[0].server_key, live / "tls.key")
    security = ServerSecurity(
        tls_cert_file=live / "tls.crt", tls_key_file=live / "tls.key", insecure=True
    )
    async with serving(lambda server: None, [], security) as running:
        yield running, live


def _renew(live: Path, certs: CertFiles) -> None:
    """Replaces the files as a secret volume does: each by a rename."""
    for source, name in ((certs.server_key, "tls.key"), (certs.server_cert, "tls.crt")):
        shutil.copy(source, live / f".{name}.new")
        (live / f".{name}.new").rename(live / name)


async def test_a_renewed_certificate_is_served_to_the_next_connection(
    server: tuple[RunningServer, Path], two_cas: tuple[CertFiles, CertFiles]
) -> None:
    running, live = server
    old, new = two_cas
    before = (await _code(running.port, old.ca_cert), await _code(running.port, new.ca_cert))
    _renew(live, new)
    after = (await _code(running.port, old.ca_cert), await _code(running.port, new.ca_cert))
    assert before == (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE)
    assert after == (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.OK)


async def test_a_certificate_file_gone_keeps_the_one_in_use(
    server: tuple[RunningServer, Path], two_cas: tuple[CertFiles, CertFiles]
) -> None:
    running, live = server
    (live / "tls.crt").unlink()
    assert await _code(running.port, two_cas[0].ca_cert) == grpc.StatusCode.OK


async def test_a_key_that_is_not_the_certificates_keeps_the_one_in_use(
    server: tuple[RunningServer, Path], two_cas: tuple[CertFiles, CertFiles]
) -> None:
    running, live = server
    old, new = two_cas
    shutil.copy(new.server_cert, live / ".tls.crt.new")
    (live / ".tls.crt.new").rename(live / "tls.crt")
    codes = (await _code(running.port, old.ca_cert), await _code(running.port, new.ca_cert))
    assert codes == (grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE)
