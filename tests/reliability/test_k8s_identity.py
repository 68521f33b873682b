"""deploy/k8s's identities against a real store process: started with the store
container's security flags, holding certificates as cert-manager would issue them from
identity.yaml's Certificates and the inference pods' csi-driver volume attributes, it
answers the manifest's exec probe, takes a pod's reports for that pod only, and takes
none from the certificate the probe presents.

No cluster here: the CA stands in for the `loraserve-ca` Issuer, and files mounted in
the pods are files in a temporary directory.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.security import ClientSecurity, secure_channel
from loraserve.inference.settings import parse_settings as parse_inference_settings
from loraserve.testing.certs import CertFiles, make_certs
from loraserve.testing.processes.services import store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import rpc_code
from loraserve.testing.store.statuses import report_request

pytestmark = pytest.mark.slow

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
POD = "loraserve-inference-7d9f8-abcde"
OTHER_POD = "loraserve-inference-7d9f8-fghij"
_EKU = {
    "server auth": ExtendedKeyUsageOID.SERVER_AUTH,
    "client auth": ExtendedKeyUsageOID.CLIENT_AUTH,
}

Manifest = dict[str, Any]


def _docs() -> list[Manifest]:
    return [
        doc for path in sorted(K8S.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
    ]


def _certificate(name: str) -> Manifest:
    (cert,) = [d for d in _docs() if d["kind"] == "Certificate" and d["metadata"]["name"] == name]
    spec: Manifest = cert["spec"]
    return spec


def _deployment(name: str) -> Manifest:
    (deployment,) = [
        d for d in _docs() if d["kind"] == "Deployment" and d["metadata"]["name"] == name
    ]
    return deployment


def _container(name: str) -> Manifest:
    container: Manifest = _deployment(name)["spec"]["template"]["spec"]["containers"][0]
    return container


def _csi_attributes() -> dict[str, str]:
    volumes = _deployment("loraserve-inference")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if "csi" in v]
    attributes: dict[str, str] = volume["csi"]["volumeAttributes"]
    return attributes


def _issue(
    ca: CertFiles,
    directory: Path,
    *,
    usages: Sequence[str],
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    uris: Sequence[str] = (),
) -> tuple[Path, Path]:
    """A certificate the CA signs as cert-manager would for these SANs and usages."""
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [
        *(x509.DNSName(n) for n in dns),
        *(x509.IPAddress(ipaddress.ip_address(n)) for n in ips),
        *(x509.UniformResourceIdentifier(u) for u in uris),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, directory.name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), False)
        .add_extension(x509.ExtendedKeyUsage([_EKU[u] for u in usages if u in _EKU]), False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True)
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    # cert-manager's CA issuer writes its CA beside the certificate.
    (directory / "ca.crt").write_bytes(ca.ca_cert.read_bytes())
    return directory / "tls.crt", directory / "tls.key"


def _relocated(args: list[str], mounts: dict[str, Path]) -> list[str]:
    """`args` with each file under a pod mount path moved to its local directory."""
    out = []
    for arg in args:
        for mount, local in mounts.items():
            arg = arg.replace(f"={mount}/", f"={local}/")
        out.append(arg)
    return out


@dataclass(frozen=True)
class Deployed:
    """A store started as the manifests start it, and where its pods' files lie."""

    address: str
    ca: CertFiles
    files: Path

    @property
    def mounts(self) -> dict[str, Path]:
        """The store's mount paths, as local directories."""
        return {
            "/etc/loraserve/tls": self.files / "store-tls",
            "/etc/loraserve/tokens": self.files / "tokens",
        }

    def store_certificate(self) -> ClientSecurity:
        tls = self.files / "store-tls"
        return ClientSecurity(
            tls_ca_file=tls / "ca.crt", tls_cert_file=tls / "tls.crt", tls_key_file=tls / "tls.key"
        )


@pytest.fixture(scope="module")
async def deployed(
    module_s3_bucket: S3Bucket, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployed]:
    """A store process with the store container's security flags and files."""
    files = tmp_path_factory.mktemp("k8s")
    ca = make_certs(files / "ca")
    spec = _certificate("loraserve-adapterstore")
    _issue(
        ca,
        files / "store-tls",
        usages=spec["usages"],
        dns=spec["dnsNames"],
        ips=spec["ipAddresses"],
    )
    (files / "tokens").mkdir()
    for role in ("reader", "writer", "admin"):
        (files / "tokens" / role).write_text(f"{role}:{role}-secret\n")
    security = [
        arg
        for arg in _container("loraserve-adapterstore")["args"]
        if arg.startswith(("--tls", "--replica-uri-prefix", "--reader-", "--writer-", "--admin-"))
    ]
    pending = Deployed("", ca, files)
    async with store_process(
        module_s3_bucket,
        files / "store.log",
        extra=_relocated(security, pending.mounts),
        channel=lambda address: secure_channel(address, pending.store_certificate()),
    ) as store:
        yield Deployed(store.address, ca, files)


def _pod_stub(deployed: Deployed, pod: str) -> tuple[Any, str]:
    """A store stub as the inference container opens it from its own args, with the
    certificate its csi-driver volume would hold in pod `pod`, and its replica id."""
    attributes = _csi_attributes()
    identity = deployed.files / f"identity-{pod}"
    if not identity.exists():
        _issue(
            deployed.ca,
            identity,
            usages=[u.strip() for u in attributes["csi.cert-manager.io/key-usages"].split(",")],
            uris=[attributes["csi.cert-manager.io/uri-sans"].replace("${POD_NAME}", pod)],
        )
    mounts = {"/var/run/loraserve/identity": identity, **deployed.mounts}
    args = _relocated(_container("loraserve-inference")["args"], mounts)
    # The kubelet sets the env var the manifest takes from metadata.name.
    settings = parse_inference_settings(args, {"INFERENCE_REPLICA_ID": pod}, "host")
    channel = secure_channel(deployed.address, settings.store_security)
    return pb_grpc.AdapterStoreServiceStub(channel), settings.replica_id


async def test_store_answers_its_exec_probes_serving(deployed: Deployed) -> None:
    port = deployed.address.rpartition(":")[2]
    container = _container("loraserve-adapterstore")
    for kind in ("readinessProbe", "livenessProbe"):
        command = _relocated(container[kind]["exec"]["command"], deployed.mounts)
        # The probe's interpreter here; its address, with the port this store bound.
        command = [sys.executable, *command[1:-1], f"{command[-1].rpartition(':')[0]}:{port}"]
        process = await asyncio.create_subprocess_exec(*command, stderr=asyncio.subprocess.PIPE)
        _, err = await process.communicate()
        assert process.returncode == 0, f"{kind}: {err.decode()}"


async def test_pod_reports_for_itself_with_its_certificate_and_no_token(
    deployed: Deployed,
) -> None:
    stub, replica_id = _pod_stub(deployed, POD)
    code = await rpc_code(stub.ReportReplicaStatus(report_request(replica_id, {})))
    assert (replica_id, code) == (POD, grpc.StatusCode.OK)


async def test_pod_cannot_report_for_another_pod(deployed: Deployed) -> None:
    stub, _ = _pod_stub(deployed, POD)
    code = await rpc_code(
        stub.ReportReplicaAlive(pb.ReportReplicaAliveRequest(replica_id=OTHER_POD))
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED


async def test_store_certificate_the_probes_present_cannot_report(deployed: Deployed) -> None:
    channel = secure_channel(deployed.address, deployed.store_certificate())
    stub = pb_grpc.AdapterStoreServiceStub(channel)
    code = await rpc_code(stub.ReportReplicaAlive(pb.ReportReplicaAliveRequest(replica_id=POD)))
    # It names no replica and carries no token: it passes the handshake, nothing more.
    assert code == grpc.StatusCode.UNAUTHENTICATED
