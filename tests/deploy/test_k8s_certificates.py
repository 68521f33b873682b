"""The identities of the Kubernetes manifests under deploy/k8s (no cluster here): each
inference pod reports to the store with its own certificate (cert-manager's csi-driver)
naming the pod, the store requires client certificates of its CA from every caller and
names what its clients and probes dial, operators get a client certificate, both
servers authenticate, and no replica token exists.
"""

from __future__ import annotations

import re
from pathlib import Path

from loraserve.common.rpc import healthcheck
from loraserve.inference.settings import InferenceSettings
from loraserve.inference.settings import parse_settings as parse_inference_settings
from loraserve.testing.k8s import DEPLOYMENTS, INFERENCE, ROOT, STORE
from loraserve.testing.k8s import container_args as _args
from loraserve.testing.k8s import container_of as _container
from loraserve.testing.k8s import environment as _environment
from loraserve.testing.k8s import flag_file as _flag_file
from loraserve.testing.k8s import issued_secrets as _issued_secrets
from loraserve.testing.k8s import named as _named
from loraserve.testing.k8s import of_kind as _kind
from loraserve.testing.k8s import secret_volumes as _secret_volumes
from loraserve.testing.k8s import store_certificate as _store_certificate
from loraserve.testing.k8s import store_probes as _store_probes
from loraserve.testing.k8s import store_settings as _store
from loraserve.testing.k8s import volume_holding as _volume_holding

CSI_DRIVER = "csi.cert-manager.io"
CA_ISSUER = "loraserve-ca"


def _inference(tmp_path: Path) -> InferenceSettings:
    return parse_inference_settings(_args(INFERENCE, tmp_path), _environment(INFERENCE), "h")


def test_store_requires_a_client_certificate_of_its_ca_from_every_caller(
    tmp_path: Path,
) -> None:
    security = _store(tmp_path).security
    assert security.tls_cert_file is not None
    assert security.tls_key_file is not None
    assert security.tls_client_ca_file is not None
    (issuer,) = _kind("Issuer")
    secret = _volume_holding(STORE, _flag_file(STORE, "--tls-client-ca"))["secret"]
    spec = _issued_secrets()[secret["secretName"]]["spec"]

    assert issuer["metadata"]["name"] == CA_ISSUER
    assert "ca" in issuer["spec"]
    # cert-manager writes the issuing CA as ca.crt beside the certificate.
    assert _flag_file(STORE, "--tls-client-ca").name == "ca.crt"
    assert (spec["issuerRef"]["kind"], spec["issuerRef"]["name"]) == ("Issuer", CA_ISSUER)
    assert "server auth" in spec["usages"]


def test_no_replica_or_store_token_is_mounted_or_passed_anywhere() -> None:
    """One token every pod holds would let any pod report as any other."""
    for deployment in DEPLOYMENTS:
        for _, secret in _secret_volumes(deployment):
            assert "replica" not in {item["key"] for item in secret["items"]}, deployment
        for arg in _container(deployment)["args"]:
            assert not re.match(r"--(replica|store)-token", arg), f"{deployment}: {arg}"
        for name in _environment(deployment):
            assert not re.search(r"(REPLICA|STORE)_TOKEN", name), f"{deployment}: {name}"


def test_inference_talks_to_the_store_with_its_pods_csi_certificate_and_no_token(
    tmp_path: Path,
) -> None:
    client = _inference(tmp_path).store_security
    assert client.token is None
    assert client.tls_ca_file is not None
    assert client.tls_cert_file is not None
    assert client.tls_key_file is not None
    volume = _volume_holding(INFERENCE, client.tls_cert_file)
    attributes = volume["csi"]["volumeAttributes"]

    assert volume["csi"]["driver"] == CSI_DRIVER
    assert volume["csi"]["readOnly"] is True
    for file in (client.tls_ca_file, client.tls_cert_file, client.tls_key_file):
        assert _volume_holding(INFERENCE, file) is volume
    # The driver's file names, as its documented defaults would name them too.
    assert attributes[f"{CSI_DRIVER}/certificate-file"] == client.tls_cert_file.name
    assert attributes[f"{CSI_DRIVER}/privatekey-file"] == client.tls_key_file.name
    assert attributes[f"{CSI_DRIVER}/ca-file"] == client.tls_ca_file.name
    assert attributes[f"{CSI_DRIVER}/issuer-name"] == CA_ISSUER
    assert attributes[f"{CSI_DRIVER}/issuer-kind"] == "Issuer"
    assert "client auth" in attributes[f"{CSI_DRIVER}/key-usages"].split(",")


def test_inference_certificate_names_its_pod_under_the_stores_replica_prefix(
    tmp_path: Path,
) -> None:
    client = _inference(tmp_path).store_security
    assert client.tls_cert_file is not None
    attributes = _volume_holding(INFERENCE, client.tls_cert_file)["csi"]["volumeAttributes"]
    prefix = _store(tmp_path).security.replica_uri_prefix

    assert attributes[f"{CSI_DRIVER}/uri-sans"] == f"{prefix}${{POD_NAME}}"


def test_inference_replica_id_is_the_pod_name_its_certificate_names(tmp_path: Path) -> None:
    # The csi-driver's ${POD_NAME} is the pod's metadata.name.
    assert _inference(tmp_path).replica_id == "<metadata.name>"


def test_no_certificate_resource_names_a_replica(tmp_path: Path) -> None:
    """A Certificate's Secret can be mounted by any pod allowed to read it: replica
    identities come only from the csi-driver, into the one pod they name."""
    prefix = _store(tmp_path).security.replica_uri_prefix
    for cert in _kind("Certificate"):
        for uri in cert["spec"].get("uris", []):
            assert not uri.startswith(prefix), f"{cert['metadata']['name']} names a replica"


def test_store_certificate_names_what_its_clients_and_probes_dial(tmp_path: Path) -> None:
    spec = _store_certificate()
    names = {*spec.get("dnsNames", []), *spec.get("ipAddresses", [])}
    store_host = _inference(tmp_path).store_address.removeprefix("dns:///").rpartition(":")[0]

    assert store_host == _named("Service", STORE)["metadata"]["name"]
    assert store_host in names
    for probe in _store_probes():
        assert healthcheck.build_parser().parse_args(probe).address.rpartition(":")[0] in names


def test_operators_get_a_client_certificate_of_the_ca_and_the_readme_says_how() -> None:
    readme = (ROOT / "deploy" / "README.md").read_text()
    (operator,) = [c for c in _kind("Certificate") if "server auth" not in c["spec"]["usages"]]
    spec = operator["spec"]

    assert "client auth" in spec["usages"]
    assert spec["issuerRef"]["name"] == CA_ISSUER
    assert f"secret {spec['secretName']}" in readme
    assert re.search(r"adapterctl [^`]*--tls-ca[^`]*--tls-cert[^`]*--tls-key[^`]*--token", readme)


def test_both_servers_authenticate_so_neither_serves_loopback_clients_only(
    tmp_path: Path,
) -> None:
    assert not _store(tmp_path).security.loopback_only
    assert not _inference(tmp_path).security.loopback_only
