"""The ports and probes of the Kubernetes manifests under deploy/k8s (no cluster here):
ports agree between the flags, the containers, the probes, the Services and the
InferencePool; probes ask for a health service the server registers, and the store's
present its mounted certificate, which may serve as a client certificate, within the
healthcheck's answer timeout.
"""

from __future__ import annotations

from pathlib import Path

from loraserve.adapterstore.api.servicer import SERVICE_NAME as STORE_SERVICE
from loraserve.adapterstore.settings import parse_settings as parse_store_settings
from loraserve.common.rpc import healthcheck
from loraserve.inference.serving.servicer import SERVICE_NAME as INFERENCE_SERVICE
from loraserve.inference.settings import parse_settings as parse_inference_settings
from loraserve.testing.k8s import INFERENCE, STORE
from loraserve.testing.k8s import container_args as _args
from loraserve.testing.k8s import container_of as _container
from loraserve.testing.k8s import environment as _environment
from loraserve.testing.k8s import flag_file as _flag_file
from loraserve.testing.k8s import issued_secrets as _issued_secrets
from loraserve.testing.k8s import named as _named
from loraserve.testing.k8s import of_kind as _kind
from loraserve.testing.k8s import port_of as _port
from loraserve.testing.k8s import probes as _probes
from loraserve.testing.k8s import secret_volumes as _secret_volumes
from loraserve.testing.k8s import store_certificate as _store_certificate
from loraserve.testing.k8s import store_probes as _store_probes


def _container_port(deployment: str, name: str) -> int:
    ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
    return int(ports[name])


def _ports_agree(deployment: str, listen: str, metrics_listen: str | None) -> None:
    assert _container_port(deployment, "grpc") == _port(listen)
    assert metrics_listen is not None
    assert _container_port(deployment, "metrics") == _port(metrics_listen)
    for port in _named("Service", deployment)["spec"]["ports"]:
        assert port["targetPort"] in {p["name"] for p in _container(deployment)["ports"]}
        assert port["port"] == _container_port(deployment, port["targetPort"])


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
