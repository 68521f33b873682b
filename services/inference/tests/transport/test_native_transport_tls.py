"""The native transport serving TLS and mTLS, and the files it refuses."""

from __future__ import annotations

import re
from pathlib import Path

import grpc
import pytest

from loraserve.testing.certs import CertFiles, make_certs
from loraserve.testing.inference.native import native_only
from loraserve.testing.inference.native_fronts import (
    echo_method,
    first_text,
    forever,
    front_before_upstream,
    native_front,
)

pytestmark = native_only


def _credentials(certs: CertFiles, *, client_cert: bool) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=certs.ca_cert.read_bytes(),
        private_key=certs.client_key.read_bytes() if client_cert else None,
        certificate_chain=certs.client_cert.read_bytes() if client_cert else None,
    )


async def test_native_transport_serves_tls_to_a_client_that_trusts_its_ca(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    front = native_front(forever, tls=(certs.server_cert, certs.server_key, None))
    try:
        credentials = _credentials(certs, client_cert=False)
        async with grpc.aio.secure_channel(f"127.0.0.1:{front.port}", credentials) as channel:
            assert await first_text(channel) == "x"
    finally:
        front.close()


async def test_native_transport_refuses_a_plaintext_client_when_it_serves_tls(
    tmp_path: Path,
) -> None:
    certs = make_certs(tmp_path)
    front = native_front(forever, tls=(certs.server_cert, certs.server_key, None))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await first_text(channel)
    finally:
        front.close()
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("client_cert", [True, False], ids=["with-cert", "without-cert"])
async def test_native_transport_with_a_client_ca_serves_only_clients_with_its_certificate(
    tmp_path: Path, client_cert: bool
) -> None:
    certs = make_certs(tmp_path)
    front = native_front(forever, tls=(certs.server_cert, certs.server_key, certs.ca_cert))
    try:
        credentials = _credentials(certs, client_cert=client_cert)
        async with grpc.aio.secure_channel(f"127.0.0.1:{front.port}", credentials) as channel:
            if client_cert:
                assert await first_text(channel) == "x"
            else:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await first_text(channel)
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        front.close()


async def test_native_transport_carries_calls_to_upstream_over_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    async with front_before_upstream(tls=(certs.server_cert, certs.server_key, certs.ca_cert)) as (
        port,
        _,
    ):
        credentials = _credentials(certs, client_cert=True)
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await echo_method(channel, "Fail")(b"", timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("broken", ["cert", "key", "client-ca"])
async def test_native_transport_refuses_a_tls_file_it_cannot_use_naming_it(
    tmp_path: Path, broken: str
) -> None:
    certs = make_certs(tmp_path / "certs")
    files = {"cert": certs.server_cert, "key": certs.server_key, "client-ca": certs.ca_cert}
    files[broken] = tmp_path / "not-pem.txt"
    files[broken].write_text("not a PEM file\n")
    with pytest.raises(ValueError, match=re.escape(str(files[broken]))):
        native_front(forever, tls=(files["cert"], files["key"], files["client-ca"]))
