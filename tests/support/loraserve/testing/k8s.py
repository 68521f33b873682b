"""The Kubernetes manifests under deploy/k8s as tests/deploy/test_k8s*.py read them: every
document of every manifest, the two Deployments' containers (their args, environment,
secret volumes, probes and ports), the settings each service parses from them, and the
Certificates cert-manager issues into Secrets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from loraserve.adapterstore.settings import AdapterStoreSettings
from loraserve.adapterstore.settings import parse_settings as parse_store_settings
from loraserve.common.rpc import healthcheck

# This file is tests/support/loraserve/testing/k8s.py.
ROOT = Path(__file__).resolve().parents[4]
K8S = ROOT / "deploy" / "k8s"

Manifest = dict[str, Any]


def _manifests() -> list[tuple[Path, Manifest]]:
    return [
        (path, doc)
        for path in sorted(K8S.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


MANIFESTS = _manifests()


def of_kind(kind: str) -> list[Manifest]:
    return [doc for _, doc in MANIFESTS if doc["kind"] == kind]


def named(kind: str, name: str) -> Manifest:
    (found,) = [doc for doc in of_kind(kind) if doc["metadata"]["name"] == name]
    return found


DEPLOYMENTS = {doc["metadata"]["name"]: doc for doc in of_kind("Deployment")}
STORE = "loraserve-adapterstore"
INFERENCE = "loraserve-inference"


def container_of(deployment: str) -> Manifest:
    containers: list[Manifest] = DEPLOYMENTS[deployment]["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    return container


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def environment(deployment: str) -> dict[str, str]:
    """The container's environment, with every reference replaced by a placeholder."""
    env: dict[str, str] = {}
    for var in container_of(deployment).get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = f"<{ref['name']}/{ref['key']}>"
        else:
            env[var["name"]] = f"<{var['valueFrom']['fieldRef']['fieldPath']}>"
    return env


def secret_volumes(deployment: str) -> Iterator[tuple[str, Manifest]]:
    """(mount path, secret volume source) of each secret the container mounts."""
    pod = DEPLOYMENTS[deployment]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container_of(deployment).get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is not None:
            yield mount["mountPath"], secret


def container_args(deployment: str, secrets_dir: Path) -> list[str]:
    """The container's args, with files of mounted secrets moved under `secrets_dir`
    (holding a placeholder), after checking the secret volume provides each file."""
    args: list[str] = list(container_of(deployment)["args"])
    for mount_path, secret in secret_volumes(deployment):
        provided = {item["path"] for item in secret["items"]}
        local = secrets_dir / secret["secretName"]
        local.mkdir(parents=True, exist_ok=True)
        for i, arg in enumerate(args):
            flag, _, value = arg.partition("=")
            if value.startswith(mount_path + "/"):
                file = value.removeprefix(mount_path + "/")
                assert file in provided, f"{arg}: secret {secret['secretName']} has no {file}"
                (local / file).write_text(f"<{secret['secretName']}/{file}>")
                args[i] = f"{flag}={local / file}"
    return args


def store_settings(tmp_path: Path) -> AdapterStoreSettings:
    return parse_store_settings(container_args(STORE, tmp_path), environment(STORE))


def flag_file(deployment: str, flag: str) -> Path:
    """The file a container's `--flag=PATH` arg names, as mounted in the pod."""
    (value,) = [
        a.partition("=")[2] for a in container_of(deployment)["args"] if a.startswith(flag + "=")
    ]
    return Path(value)


def volume_holding(deployment: str, file: Path) -> Manifest:
    """The volume the container mounts at `file`'s directory."""
    pod = DEPLOYMENTS[deployment]["spec"]["template"]["spec"]
    volumes: dict[str, Manifest] = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = container_of(deployment)["volumeMounts"]
    (volume,) = [volumes[m["name"]] for m in mounts if m["mountPath"] == str(file.parent)]
    return volume


def issued_secrets() -> dict[str, Manifest]:
    """The Certificates, by the Secret cert-manager writes each into."""
    return {cert["spec"]["secretName"]: cert for cert in of_kind("Certificate")}


def probes(deployment: str) -> list[Manifest]:
    container = container_of(deployment)
    assert {"readinessProbe", "livenessProbe"} <= set(container)
    return [
        container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container
    ]


def store_probes() -> list[list[str]]:
    """The healthcheck's arguments in each of the store's exec probes."""
    module = ["python", "-m", healthcheck.__name__]
    commands = [probe["exec"]["command"] for probe in probes(STORE)]
    assert all(command[:3] == module for command in commands), commands
    return [command[3:] for command in commands]


def store_certificate() -> Manifest:
    secret = volume_holding(STORE, flag_file(STORE, "--tls-cert"))["secret"]["secretName"]
    spec: Manifest = issued_secrets()[secret]["spec"]
    return spec
