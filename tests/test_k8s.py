"""The Kubernetes manifests under deploy/k8s cannot be applied here (no cluster): check
what can be checked, as tests/test_compose.py does for compose.

Every manifest parses; each container runs an image docker/ builds, with arguments and
environment the service's real settings parser accepts; ports agree between the flags,
the containers, the probes, the Services and the InferencePool; probes ask for a health
service the server registers; secrets are referenced, never inlined. Identity: each
inference pod reports to the store with its own certificate (cert-manager's csi-driver)
naming the pod, the store requires client certificates, and no replica token exists.
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
from loraserve.adapterstore.settings import AdapterStoreSettings
from loraserve.adapterstore.settings import build_parser as build_store_parser
from loraserve.adapterstore.settings import parse_settings as parse_store_settings
from loraserve.common.rpc import healthcheck
from loraserve.inference.serving.servicer import SERVICE_NAME as INFERENCE_SERVICE
from loraserve.inference.settings import InferenceSettings
from loraserve.inference.settings import build_parser as build_inference_parser
from loraserve.inference.settings import parse_settings as parse_inference_settings

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
GPU = "nvidia.com/gpu"
CSI_DRIVER = "csi.cert-manager.io"
CA_ISSUER = "loraserve-ca"

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


def _store(tmp_path: Path) -> AdapterStoreSettings:
    return parse_store_settings(_args(STORE, tmp_path), _environment(STORE))


def _inference(tmp_path: Path) -> InferenceSettings:
    return parse_inference_settings(_args(INFERENCE, tmp_path), _environment(INFERENCE), "h")


def _flag_file(deployment: str, flag: str) -> Path:
    """The file a container's `--flag=PATH` arg names, as mounted in the pod."""
    (value,) = [
        a.partition("=")[2] for a in _container(deployment)["args"] if a.startswith(flag + "=")
    ]
    return Path(value)


def _volume_holding(deployment: str, file: Path) -> Manifest:
    """The volume the container mounts at `file`'s directory."""
    pod = DEPLOYMENTS[deployment]["spec"]["template"]["spec"]
    volumes: dict[str, Manifest] = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = _container(deployment)["volumeMounts"]
    (volume,) = [volumes[m["name"]] for m in mounts if m["mountPath"] == str(file.parent)]
    return volume


def _issued_secrets() -> dict[str, Manifest]:
    """The Certificates, by the Secret cert-manager writes each into."""
    return {cert["spec"]["secretName"]: cert for cert in _kind("Certificate")}


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


def _store_certificate() -> Manifest:
    secret = _volume_holding(STORE, _flag_file(STORE, "--tls-cert"))["secret"]["secretName"]
    spec: Manifest = _issued_secrets()[secret]["spec"]
    return spec


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
    assert not _store(tmp_path).security.loopback_only
    assert not _inference(tmp_path).security.loopback_only


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


def _probes(deployment: str) -> list[Manifest]:
    container = _container(deployment)
    assert {"readinessProbe", "livenessProbe"} <= set(container)
    return [
        container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container
    ]


def _store_probes() -> list[list[str]]:
    """The healthcheck's arguments in each of the store's exec probes."""
    module = ["python", "-m", healthcheck.__name__]
    commands = [probe["exec"]["command"] for probe in _probes(STORE)]
    assert all(command[:3] == module for command in commands), commands
    return [command[3:] for command in commands]


def test_inference_probes_ask_the_grpc_port_for_a_registered_health_service() -> None:
    for probe in _probes(INFERENCE):
        assert probe["grpc"]["port"] == _container_port(INFERENCE, "grpc")
        # grpc.health.v1 answers "" (the server) and each service it registers.
        assert probe["grpc"].get("service", "") in {"", INFERENCE_SERVICE}


def test_store_probes_present_the_stores_mounted_certificate_to_its_grpc_port(
    tmp_path: Path,
) -> None:
    """The kubelet's gRPC probes speak no TLS; the store requires client certificates."""
    secrets = dict(_secret_volumes(STORE))
    for argv in _store_probes():
        args = healthcheck.build_parser().parse_args(argv)
        assert _port(args.address) == _container_port(STORE, "grpc")
        assert args.service == STORE_SERVICE
        for file in (args.tls_ca, args.tls_cert, args.tls_key):
            assert file is not None, argv
            secret = secrets[str(file.parent)]
            assert file.name in {item["path"] for item in secret["items"]}, file
            assert secret["secretName"] in _issued_secrets()


def test_store_certificate_may_be_the_probes_client_certificate() -> None:
    probe_certs = {healthcheck.build_parser().parse_args(a).tls_cert for a in _store_probes()}

    assert probe_certs == {_flag_file(STORE, "--tls-cert")}
    assert "client auth" in _store_certificate()["usages"]


def test_store_probes_allow_the_healthcheck_its_answer_timeout() -> None:
    for probe in _probes(STORE):
        assert probe.get("timeoutSeconds", 1) > healthcheck.DEFAULT_TIMEOUT_S


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
