"""The Kubernetes manifests under deploy/k8s cannot be applied here (no cluster): check
what can be checked, as tests/deploy/test_compose.py does for compose.

Every manifest parses and is listed in its kustomization; each container runs an image
docker/ builds, with arguments and environment the service's real settings parser
accepts; the Services, budgets, selectors and InferencePool pick the Deployments' pods.
Ports and probes are checked in test_k8s_probes.py, the identities (certificates, no
replica token) in test_k8s_certificates.py, secrets in test_k8s_secrets.py.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from loraserve.adapterstore.settings import build_parser as build_store_parser
from loraserve.adapterstore.settings import parse_settings as parse_store_settings
from loraserve.inference.settings import build_parser as build_inference_parser
from loraserve.inference.settings import parse_settings as parse_inference_settings
from loraserve.testing.k8s import DEPLOYMENTS, INFERENCE, K8S, MANIFESTS, ROOT, STORE
from loraserve.testing.k8s import container_args as _args
from loraserve.testing.k8s import container_of as _container
from loraserve.testing.k8s import environment as _environment
from loraserve.testing.k8s import named as _named
from loraserve.testing.k8s import of_kind as _kind
from loraserve.testing.k8s import port_of as _port
from loraserve.testing.k8s import store_settings as _store

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
GPU = "nvidia.com/gpu"


def _pod_labels(deployment: str) -> dict[str, str]:
    labels: dict[str, str] = DEPLOYMENTS[deployment]["spec"]["template"]["metadata"]["labels"]
    return labels


PARSERS: dict[str, Callable[[dict[str, str]], Any]] = {
    STORE: build_store_parser,
    INFERENCE: build_inference_parser,
}


def test_manifests_are_the_store_and_inference_with_their_services_and_budgets() -> None:
    assert set(DEPLOYMENTS) == {STORE, INFERENCE}
    for name in (STORE, INFERENCE):
        assert _named("Service", name)
        assert _named("PodDisruptionBudget", name)


def test_kustomization_applies_the_servers_and_the_identities_they_need() -> None:
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    kinds = {
        (doc["apiVersion"], doc["kind"])
        for file in listed
        for doc in yaml.safe_load_all((K8S / file).read_text())
    }
    assert kinds == {
        ("apps/v1", "Deployment"),
        ("v1", "Service"),
        ("policy/v1", "PodDisruptionBudget"),
        ("cert-manager.io/v1", "Issuer"),
        ("cert-manager.io/v1", "Certificate"),
    }


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


def test_store_accepts_its_args_with_reader_writer_admin_tokens_and_s3_credentials(
    tmp_path: Path,
) -> None:
    settings = _store(tmp_path)

    assert settings.s3.access_key_id == "<loraserve-s3/access-key-id>"
    assert settings.s3.secret_access_key == "<loraserve-s3/secret-access-key>"
    assert settings.security.reader_tokens
    assert settings.security.writer_tokens
    assert settings.security.admin_tokens


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
