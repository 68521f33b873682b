"""The Kubernetes manifests under deploy/k8s cannot be applied here (no cluster): check
what can be checked, as tests/test_compose.py does for compose.

Every manifest parses; each container runs an image docker/ builds, with arguments and
environment the service's real settings parser accepts; ports agree between the flags,
the containers, the probes, the Services and the InferencePool; probes ask for a health
service the server registers; secrets are referenced, never inlined.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loraserve.adapterstore.api.servicer import SERVICE_NAME as STORE_SERVICE
from loraserve.adapterstore.settings import build_parser as build_store_parser
from loraserve.adapterstore.settings import parse_settings as parse_store_settings
from loraserve.inference.serving.servicer import SERVICE_NAME as INFERENCE_SERVICE
from loraserve.inference.settings import build_parser as build_inference_parser
from loraserve.inference.settings import parse_settings as parse_inference_settings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
GPU = "nvidia.com/gpu"

Manifest = dict[str, Any]


def _manifests() -> list[tuple[Path, Manifest]]:
    return [
        (path, doc)
        for path in sorted(K8S.rglob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


MANIFESTS = _manifests()


def _kind(kind: str) -> list[Manifest]:
    return [doc for _, doc in MANIFESTS if doc["kind"] == kind]


def _named(kind: str, name: str) -> Manifest:
    (found,) = [doc for doc in _kind(kind) if doc["metadata"]["name"] == name]
    return found


DEPLOYMENTS = {doc["metadata"]["name"]: doc for doc in _kind("Deployment")}
STORE = "loraserve-adapterstore"
INFERENCE = "loraserve-inference"


def _container(deployment: str) -> Manifest:
    containers: list[Manifest] = DEPLOYMENTS[deployment]["spec"]["template"]["spec"]["containers"]
    (container,) = containers
    return container


def _pod_labels(deployment: str) -> dict[str, str]:
    labels: dict[str, str] = DEPLOYMENTS[deployment]["spec"]["template"]["metadata"]["labels"]
    return labels


def _container_port(deployment: str, name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
    return int(ports[name])


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _environment(deployment: str) -> dict[str, str]:
    """The container's environment, with every reference replaced by a placeholder."""
    env: dict[str, str] = {}
    for var in _container(deployment).get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = f"<{ref['name']}/{ref['key']}>"
        else:
            env[var["name"]] = f"<{var['valueFrom']['fieldRef']['fieldPath']}>"
    return env


def _secret_volumes(deployment: str) -> Iterator[tuple[str, Manifest]]:
    """(mount path, secret volume source) of each secret the container mounts."""
    pod = DEPLOYMENTS[deployment]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in _container(deployment).get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is not None:
            yield mount["mountPath"], secret


def _args(deployment: str, secrets_dir: Path) -> list[str]:
    """The container's args, with files of mounted secrets moved under `secrets_dir`
    (holding a placeholder), after checking the secret volume provides each file."""
    args: list[str] = list(_container(deployment)["args"])
    for mount_path, secret in _secret_volumes(deployment):
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


PARSERS: dict[str, Callable[[dict[str, str]], Any]] = {
    STORE: build_store_parser,
    INFERENCE: build_inference_parser,
}


def test_manifests_are_the_store_and_inference_with_their_services_and_budgets() -> None:
    assert set(DEPLOYMENTS) == {STORE, INFERENCE}
    for name in (STORE, INFERENCE):
        assert _named("Service", name)
        assert _named("PodDisruptionBudget", name)


def test_every_manifest_is_listed_in_its_folders_kustomization() -> None:
    for folder in {path.parent for path, _ in MANIFESTS}:
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        listed = set(kustomization["resources"])
        present = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
        assert listed == present, f"{folder.name}: kustomization lists {listed}, has {present}"


@pytest.mark.parametrize("deployment", [STORE, INFERENCE])
def test_image_is_the_one_docker_builds_at_the_project_version(deployment: str) -> None:
    image = _container(deployment)["image"]
    repository, _, tag = image.rpartition(":")
    service = repository.removeprefix("loraserve/")
    dockerfile = ROOT / "docker" / f"{service}.Dockerfile"

    assert dockerfile.exists(), f"{image}: no docker/{service}.Dockerfile builds it"
    assert tag == PROJECT["version"]
    entrypoint = re.search(r'^ENTRYPOINT\s+\["([^"]+)"\]', dockerfile.read_text(), re.M)
    assert entrypoint is not None
    assert entrypoint.group(1) in PROJECT["scripts"]


@pytest.mark.parametrize("deployment", [STORE, INFERENCE])
def test_every_arg_is_a_flag_of_the_services_parser(deployment: str) -> None:
    serve = PARSERS[deployment]({})._subparsers._group_actions[0].choices["serve"]
    flags = {option for action in serve._actions for option in action.option_strings}
    args = _container(deployment)["args"]

    assert args[0] == "serve"
    for arg in args[1:]:
        assert arg.partition("=")[0] in flags, f"{deployment}: {arg} is not a flag"


@pytest.mark.parametrize(
    ("deployment", "prefix"), [(STORE, "ADAPTERSTORE_"), (INFERENCE, "INFERENCE_")]
)
def test_environment_names_are_the_services_env_fallbacks(deployment: str, prefix: str) -> None:
    for name in _environment(deployment):
        assert name.startswith(prefix), f"{deployment}: {name} is not read by the service"


def test_store_accepts_its_args_and_has_every_token_and_s3_credentials(tmp_path: Path) -> None:
    settings = parse_store_settings(_args(STORE, tmp_path), _environment(STORE))

    assert settings.s3.access_key_id == "<loraserve-s3/access-key-id>"
    assert settings.s3.secret_access_key == "<loraserve-s3/secret-access-key>"
    assert settings.security.writer_tokens
    assert settings.security.reader_tokens
    assert settings.security.replica_tokens


def test_inference_accepts_its_args_and_reports_with_the_stores_replica_token(
    tmp_path: Path,
) -> None:
    store = parse_store_settings(_args(STORE, tmp_path), _environment(STORE))
    inference = parse_inference_settings(
        _args(INFERENCE, tmp_path), _environment(INFERENCE), "host"
    )

    assert inference.replica_id == "<metadata.name>"
    assert [t.secret for t in store.security.replica_tokens] == [inference.store_security.token]
    assert inference.security.reader_tokens


def test_inference_finds_every_store_replica_through_the_headless_store_service(
    tmp_path: Path,
) -> None:
    inference = parse_inference_settings(
        _args(INFERENCE, tmp_path), _environment(INFERENCE), "host"
    )
    store = parse_store_settings(_args(STORE, tmp_path), _environment(STORE))
    service = _named("Service", STORE)
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")

    assert service["spec"]["clusterIP"] == "None"
    assert inference.store_address == f"dns:///{STORE}:{grpc_port}"
    assert grpc_port == _port(store.listen)


def _ports_agree(deployment: str, listen: str, metrics_listen: str | None) -> None:
    assert _container_port(deployment, "grpc") == _port(listen)
    assert metrics_listen is not None
    assert _container_port(deployment, "metrics") == _port(metrics_listen)
    for port in _named("Service", deployment)["spec"]["ports"]:
        assert port["targetPort"] in {p["name"] for p in _container(deployment)["ports"]}
        assert port["port"] == _container_port(deployment, port["targetPort"])


def test_both_servers_authenticate_so_neither_serves_loopback_clients_only(
    tmp_path: Path,
) -> None:
    store = parse_store_settings(_args(STORE, tmp_path), _environment(STORE))
    inference = parse_inference_settings(
        _args(INFERENCE, tmp_path), _environment(INFERENCE), "host"
    )
    assert not store.security.loopback_only
    assert not inference.security.loopback_only


def test_store_ports_agree_between_flags_container_and_service(tmp_path: Path) -> None:
    settings = parse_store_settings(_args(STORE, tmp_path), _environment(STORE))
    _ports_agree(STORE, settings.listen, settings.metrics_listen)


def test_inference_ports_agree_between_flags_container_service_and_pool(tmp_path: Path) -> None:
    settings = parse_inference_settings(_args(INFERENCE, tmp_path), _environment(INFERENCE), "h")
    assert settings.openai_listen is not None
    _ports_agree(INFERENCE, settings.listen, settings.metrics_listen)
    (pool,) = _kind("InferencePool")

    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [_port(settings.openai_listen)]
    assert _container_port(INFERENCE, "http") == _port(settings.openai_listen)


@pytest.mark.parametrize(
    ("deployment", "service"), [(STORE, STORE_SERVICE), (INFERENCE, INFERENCE_SERVICE)]
)
def test_probes_ask_the_grpc_port_for_a_registered_health_service(
    deployment: str, service: str
) -> None:
    container = _container(deployment)
    probes = [
        container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container
    ]

    assert {"readinessProbe", "livenessProbe"} <= set(container)
    for probe in probes:
        assert probe["grpc"]["port"] == _container_port(deployment, "grpc")
        # grpc.health.v1 answers "" (the server) and each service it registers.
        assert probe["grpc"].get("service", "") in {"", service}


@pytest.mark.parametrize("deployment", [STORE, INFERENCE])
def test_pods_outlive_the_servers_shutdown_grace(deployment: str, tmp_path: Path) -> None:
    args, env = _args(deployment, tmp_path), _environment(deployment)
    settings = (
        parse_store_settings(args, env)
        if deployment == STORE
        else parse_inference_settings(args, env, "h")
    )
    grace = DEPLOYMENTS[deployment]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]

    assert grace > settings.shutdown_grace_seconds


def test_store_runs_two_replicas_and_inference_asks_for_a_gpu() -> None:
    resources = _container(INFERENCE)["resources"]

    assert DEPLOYMENTS[STORE]["spec"]["replicas"] == 2
    assert resources["requests"][GPU] == 1
    assert resources["limits"][GPU] == 1


def test_inference_service_is_headless_for_client_side_balancing() -> None:
    assert _named("Service", INFERENCE)["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("kind", ["Service", "PodDisruptionBudget", "InferencePool"])
def test_selectors_pick_the_deployments_pods(kind: str) -> None:
    for doc in _kind(kind):
        selector = doc["spec"]["selector"]
        labels = selector.get("matchLabels", selector)
        name = doc["metadata"]["name"]
        assert labels.items() <= _pod_labels(name).items(), f"{kind} {name} selects no pod"


def test_inference_pool_is_the_ga_api_and_routes_to_the_openai_port() -> None:
    (pool,) = _kind("InferencePool")
    (route,) = _kind("HTTPRoute")
    (backend,) = route["spec"]["rules"][0]["backendRefs"]

    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["spec"]["endpointPickerRef"]["port"]["number"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool["metadata"]["name"],
    )


def _secret_refs() -> Iterator[tuple[str, str]]:
    for deployment in DEPLOYMENTS:
        for var in _container(deployment).get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                yield ref["name"], ref["key"]
        for _, secret in _secret_volumes(deployment):
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
