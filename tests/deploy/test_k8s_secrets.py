"""The secrets of the Kubernetes manifests under deploy/k8s (no cluster here): they are
referenced, never inlined, and deploy/README.md creates every one the pods reference
and the CA secret the Issuer signs with.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from loraserve.testing.k8s import DEPLOYMENTS, ROOT
from loraserve.testing.k8s import container_of as _container
from loraserve.testing.k8s import issued_secrets as _issued_secrets
from loraserve.testing.k8s import of_kind as _kind
from loraserve.testing.k8s import secret_volumes as _secret_volumes


def _secret_refs() -> Iterator[tuple[str, str]]:
    """The operator's secrets the pods reference; cert-manager writes the others."""
    for deployment in DEPLOYMENTS:
        for var in _container(deployment).get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                yield ref["name"], ref["key"]
        for _, secret in _secret_volumes(deployment):
            if secret["secretName"] not in _issued_secrets():
                for item in secret["items"]:
                    yield secret["secretName"], item["key"]


def test_secrets_are_referenced_never_inlined() -> None:
    assert not _kind("Secret")
    for deployment in DEPLOYMENTS:
        for var in _container(deployment).get("env", []):
            secretish = re.search(r"TOKEN|SECRET|KEY|PASSWORD", var["name"])
            assert not (secretish and "value" in var), f"{var['name']} is inlined"
        for arg in _container(deployment)["args"]:
            assert not re.match(r"--(\w+-)*(token|secret-access-key|access-key-id)=", arg), arg


def test_deploy_readme_creates_every_secret_the_manifests_reference() -> None:
    readme = (ROOT / "deploy" / "README.md").read_text()
    refs = set(_secret_refs())

    assert refs
    for name, key in refs:
        assert re.search(rf"create secret generic {name}\b[^`]*--from-\w+={key}=", readme), (
            f"deploy/README.md does not create secret {name} key {key}"
        )


def test_deploy_readme_creates_the_ca_secret_the_issuer_signs_with() -> None:
    readme = (ROOT / "deploy" / "README.md").read_text()
    (issuer,) = _kind("Issuer")
    name = issuer["spec"]["ca"]["secretName"]

    assert re.search(rf"create secret tls {name} --cert=\S+ --key=\S+", readme), name
