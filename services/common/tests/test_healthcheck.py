"""`python -m loraserve.common.rpc.healthcheck` against real gRPC servers on 127.0.0.1:
plaintext as compose probes it, and requiring client certificates as the Kubernetes store
is probed (its exec probes present the store's own certificate)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from loraserve.common.rpc.healthcheck import main
from loraserve.common.rpc.security import ServerSecurity
from loraserve.common.rpc.server import RunningServer
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.certs import CertFiles, make_certs
from loraserve.testing.grpc import serving

SERVICE = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name


def _register(server: grpc.aio.Server) -> None:
    pb_grpc.add_InferenceServiceServicer_to_server(pb_grpc.InferenceServiceServicer(), server)


@pytest.fixture
def certs(tmp_path: Path) -> CertFiles:
    return make_certs(tmp_path / "certs")


@pytest.fixture
async def mtls_server(certs: CertFiles) -> AsyncIterator[RunningServer]:
    security = ServerSecurity(
        tls_cert_file=certs.server_cert,
        tls_key_file=certs.server_key,
        tls_client_ca_file=certs.ca_cert,
    )
    async with serving(_register, [SERVICE], security=security) as server:
        yield server


def _tls_flags(certs: CertFiles) -> list[str]:
    return [
        f"--tls-ca={certs.ca_cert}",
        f"--tls-cert={certs.client_cert}",
        f"--tls-key={certs.client_key}",
    ]


async def _probe(*argv: str) -> int:
    # The probe's blocking channel must not hold up the loop the server runs on.
    return await asyncio.to_thread(main, list(argv))


async def test_client_certificate_probe_of_a_registered_service_reports_serving(
    mtls_server: RunningServer, certs: CertFiles
) -> None:
    code = await _probe(*_tls_flags(certs), "--service", SERVICE, f"127.0.0.1:{mtls_server.port}")
    assert code == 0


async def test_client_certificate_probe_of_the_whole_server_reports_serving(
    mtls_server: RunningServer, certs: CertFiles
) -> None:
    assert await _probe(*_tls_flags(certs), f"127.0.0.1:{mtls_server.port}") == 0


async def test_probe_without_client_certificate_fails_against_an_mtls_server(
    mtls_server: RunningServer, certs: CertFiles
) -> None:
    code = await _probe(f"--tls-ca={certs.ca_cert}", f"127.0.0.1:{mtls_server.port}")
    assert code == 1


async def test_plaintext_probe_fails_against_a_tls_server(mtls_server: RunningServer) -> None:
    assert await _probe(f"127.0.0.1:{mtls_server.port}") == 1


async def test_probe_of_an_unregistered_service_fails(
    mtls_server: RunningServer, certs: CertFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await _probe(
        *_tls_flags(certs), "--service=no.such.Service", f"127.0.0.1:{mtls_server.port}"
    )

    assert code == 1
    assert "no.such.Service: NOT_FOUND" in capsys.readouterr().err


async def test_probe_of_a_not_serving_service_fails_naming_its_status(
    mtls_server: RunningServer, certs: CertFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    await mtls_server.set_serving(False)
    code = await _probe(*_tls_flags(certs), "--service", SERVICE, f"127.0.0.1:{mtls_server.port}")

    assert code == 1
    assert f"{SERVICE}: NOT_SERVING" in capsys.readouterr().err


async def test_positional_address_alone_still_checks_a_plaintext_server() -> None:
    async with serving(_register, [SERVICE]) as server:
        assert await _probe(f"127.0.0.1:{server.port}") == 0


async def test_module_runs_as_compose_calls_it() -> None:
    async with serving(_register, [SERVICE]) as server:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loraserve.common.rpc.healthcheck", f"127.0.0.1:{server.port}"
        )
        assert await process.wait() == 0


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--tls-ca=CA", "--tls-cert=CERT"], "--tls-cert and --tls-key must be given together"),
        (["--tls-cert=CERT", "--tls-key=KEY"], "--tls-cert needs --tls-ca"),
        (["--tls-ca=/no/such/ca.pem"], "cannot read /no/such/ca.pem"),
    ],
)
def test_unusable_tls_flags_exit_2_naming_the_problem(
    flags: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*flags, "127.0.0.1:1"])

    assert exited.value.code == 2
    assert problem in capsys.readouterr().err


def test_missing_address_exits_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loraserve.common.rpc.healthcheck"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "HOST:PORT" in result.stderr
