"""docker-compose.yml cannot run here (no Docker engine): check what can be checked.

It parses; every image is pinned; every Dockerfile and file it copies exists; each
container's entry point is one of the project's console scripts; and the flags and
environment it passes are accepted by the servers' real settings parsers.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import yaml

from loraserve.adapterstore.settings import parse_settings as parse_store_settings
from loraserve.inference.settings import parse_settings as parse_inference_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# ${VAR:-default} and ${VAR:?message}: what `docker compose` substitutes from .env.
_VARIABLE = re.compile(r"\$\{(\w+)(?::-([^}]*)|:\?[^}]*)?\}")


def _interpolate(value: str) -> str:
    return _VARIABLE.sub(
        lambda m: m.group(2) if m.group(2) is not None else f"<{m.group(1)}>", value
    )


def _environment(service: str) -> dict[str, str]:
    env = SERVICES[service].get("environment", {})
    return {key: _interpolate(str(value)) for key, value in env.items()}


def _command(service: str) -> list[str]:
    return [_interpolate(arg) for arg in SERVICES[service]["command"]]


def _dockerfile(service: str) -> Path:
    build: dict[str, str] = SERVICES[service]["build"]
    return ROOT / build["context"] / build["dockerfile"]


def _images() -> list[str]:
    images = [s["image"] for s in SERVICES.values() if "image" in s]
    for service in SERVICES.values():
        if "build" in service:
            dockerfile = ROOT / service["build"]["context"] / service["build"]["dockerfile"]
            images += re.findall(r"^FROM\s+(\S+)", dockerfile.read_text(), re.M)
    return images


def test_compose_defines_minio_store_and_inference() -> None:
    assert {"minio", "minio-bucket", "adapterstore", "inference"} <= set(SERVICES)


@pytest.mark.parametrize("image", _images())
def test_every_image_is_pinned_to_a_version(image: str) -> None:
    name, _, tag = image.rpartition(":")
    assert name, f"{image} has no tag"
    assert tag != "latest", f"{image} is not pinned"


@pytest.mark.parametrize("service", ["adapterstore", "inference"])
def test_dockerfile_copies_only_files_that_exist(service: str) -> None:
    text = _dockerfile(service).read_text().replace("\\\n", " ")
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        words = shlex.split(line)
        if words[0].startswith("--from="):
            # From an earlier build stage, not from the repository.
            continue
        for source in words[:-1]:
            assert (ROOT / source).exists(), f"{_dockerfile(service).name} copies missing {source}"


@pytest.mark.parametrize("service", ["adapterstore", "inference"])
def test_entrypoint_is_a_console_script_of_the_project(service: str) -> None:
    entrypoint = re.search(r'^ENTRYPOINT\s+\["([^"]+)"\]', _dockerfile(service).read_text(), re.M)
    assert entrypoint is not None
    assert entrypoint.group(1) in SCRIPTS


def test_store_accepts_the_flags_and_environment_compose_passes() -> None:
    command = _command("adapterstore")
    assert command[0] == "serve"
    settings = parse_store_settings(command, _environment("adapterstore"))
    assert settings.security.writer_tokens
    assert settings.security.reader_tokens
    assert settings.security.admin_tokens
    assert settings.security.replica_tokens


def test_inference_accepts_the_flags_and_environment_compose_passes() -> None:
    command = _command("inference")
    assert command[0] == "serve"
    settings = parse_inference_settings(command, _environment("inference"), "host")
    assert settings.replica_id == "inference-0"
    assert settings.store_security.token == "<LORASERVE_REPLICA_TOKEN>"
    assert settings.engine.max_lora_rank is None  # auto


def test_inference_reports_to_the_store_with_the_stores_replica_token() -> None:
    store = parse_store_settings(_command("adapterstore"), _environment("adapterstore"))
    inference = parse_inference_settings(_command("inference"), _environment("inference"), "h")
    (token,) = store.security.replica_tokens
    assert (token.principal, token.secret) == (inference.replica_id, inference.store_security.token)
    assert inference.store_security.token not in [t.secret for t in store.security.reader_tokens]


def test_both_servers_authenticate_so_neither_serves_loopback_clients_only() -> None:
    store = parse_store_settings(_command("adapterstore"), _environment("adapterstore"))
    inference = parse_inference_settings(_command("inference"), _environment("inference"), "h")
    assert not store.security.loopback_only
    assert not inference.security.loopback_only


def test_inference_reserves_a_gpu() -> None:
    devices = SERVICES["inference"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in device["capabilities"] for device in devices)


@pytest.mark.parametrize("service", ["adapterstore", "inference"])
def test_health_check_runs_a_module_of_the_project(service: str) -> None:
    test = SERVICES[service]["healthcheck"]["test"]
    module = test[test.index("-m") + 1]
    assert find_spec(module) is not None, f"{module} does not exist"


def test_store_waits_for_the_bucket_and_inference_for_a_healthy_store() -> None:
    assert SERVICES["adapterstore"]["depends_on"]["minio-bucket"]["condition"] == (
        "service_completed_successfully"
    )
    assert SERVICES["inference"]["depends_on"]["adapterstore"]["condition"] == "service_healthy"
