"""deploy/envoy/envoy.yaml routes by adapter as the Python client does: the header the
client sends, ring hash with bounded load, HTTP/2 to the replicas, grpc.health.v1 checks,
on the ports the inference service and adapterctl use by default. Envoy itself is not
run here (it is not installed); this checks the file against the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from loraserve.adapterctl.settings import DEFAULT_INFERENCE_ADDRESS
from loraserve.clients.routing import ADAPTER_HASH_HEADER
from loraserve.inference.settings import parse_settings

ENVOY = Path(__file__).resolve().parents[2] / "deploy" / "envoy" / "envoy.yaml"


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ENVOY.read_text())
    return loaded


def listener(config: dict[str, Any]) -> dict[str, Any]:
    (only,) = config["static_resources"]["listeners"]
    result: dict[str, Any] = only
    return result


def route(config: dict[str, Any]) -> dict[str, Any]:
    (chain,) = listener(config)["filter_chains"]
    (manager,) = chain["filters"]
    (host,) = manager["typed_config"]["route_config"]["virtual_hosts"]
    (only,) = host["routes"]
    result: dict[str, Any] = only["route"]
    return result


def cluster(config: dict[str, Any]) -> dict[str, Any]:
    (only,) = config["static_resources"]["clusters"]
    result: dict[str, Any] = only
    return result


def inference_port() -> int:
    settings = parse_settings(["serve", "--model", "m", "--store", "s:1"], {}, "host")
    return int(settings.listen.rpartition(":")[2])


def test_envoy_hashes_the_header_the_client_sends(config: dict[str, Any]) -> None:
    assert route(config)["hash_policy"] == [{"header": {"header_name": ADAPTER_HASH_HEADER}}]
    assert route(config)["cluster"] == cluster(config)["name"]


def test_envoy_uses_a_ring_hash_with_bounded_load(config: dict[str, Any]) -> None:
    upstream = cluster(config)
    factor = upstream["common_lb_config"]["consistent_hashing_lb_config"]["hash_balance_factor"]
    assert upstream["lb_policy"] == "RING_HASH"
    # Envoy refuses factors under 100 (100 would allow no load above the average).
    assert factor > 100


def test_envoy_speaks_http2_to_replicas_and_checks_their_grpc_health(
    config: dict[str, Any],
) -> None:
    upstream = cluster(config)
    options = upstream["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    (check,) = upstream["health_checks"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    assert check["grpc_health_check"] == {"service_name": ""}


def test_envoy_listens_and_dials_on_the_inference_port(config: dict[str, Any]) -> None:
    (endpoints,) = cluster(config)["load_assignment"]["endpoints"]
    ports = {
        "listener": listener(config)["address"]["socket_address"]["port_value"],
        "replicas": endpoints["lb_endpoints"][0]["endpoint"]["address"]["socket_address"][
            "port_value"
        ],
        "adapterctl": int(DEFAULT_INFERENCE_ADDRESS.rpartition(":")[2]),
    }
    assert ports == dict.fromkeys(ports, inference_port())
