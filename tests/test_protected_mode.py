"""Protected mode: with no token and no client-certificate CA, both servers serve loopback
clients only, say why to everyone else and how to change it, and `--insecure` opens them.

The servers are real (`adapterstore serve` as a process, the inference service's gRPC and
OpenAI fronts as `inference serve` starts them, on an in-memory engine) and listen on
0.0.0.0 inside a private network namespace, where 192.0.2.1 is this host's non-loopback
address (`loraserve.testing.netns`): nothing leaves the namespace.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from loraserve.adapterstore.settings import build_parser as store_parser
from loraserve.common.errors import FailedPrecondition
from loraserve.inference.serving import RuntimeRef
from loraserve.inference.settings import InferenceSettings, build_parser, parse_settings
from loraserve.inference.transport import start_grpc_front
from loraserve.testing.inference.native import native_only
from loraserve.testing.netns import REMOTE, netns_only, run_in_netns

LOOPBACK = "127.0.0.1"
TOKEN = "s3cret"


def _call(
    server: str,
    client: str,
    *flags: str,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Any:
    """What `server`, started with `flags` and `env`, answered a call from `client`."""
    calls = [sys.executable, "-m", "loraserve.testing.protected_calls", server]
    return run_in_netns(
        [*calls, "--client", client, *(["--token", token] if token else []), "--", *flags],
        env=env,
    )


def _assert_refused_naming_the_fix(answer: dict[str, str]) -> None:
    assert answer["code"] == "UNAUTHENTICATED"
    message = answer["details"]
    assert f"this call came from {REMOTE}" in message
    assert "--insecure" in message
    assert "--writer-token" in message
    assert "--tls-client-ca" in message


@pytest.fixture(scope="module")
def store_without_auth() -> Any:
    """The adapter store with no token, called from a non-loopback client."""
    return _call("store", REMOTE)


@netns_only
def test_store_refuses_a_remote_client_without_auth_naming_the_fix(
    store_without_auth: Any,
) -> None:
    _assert_refused_naming_the_fix(store_without_auth["call"])


@netns_only
def test_store_health_stays_open_to_a_remote_client_without_auth(store_without_auth: Any) -> None:
    assert store_without_auth["health"] == "SERVING"


@netns_only
def test_store_warns_at_start_up_that_it_serves_loopback_clients_only(
    store_without_auth: Any,
) -> None:
    assert store_without_auth["startup"] == ["protected_mode"]


@netns_only
def test_store_serves_a_remote_client_with_a_token() -> None:
    answer = _call("store", REMOTE, f"--reader-token={TOKEN}", token=TOKEN)
    assert answer["call"]["code"] == "OK"


@netns_only
def test_store_serves_a_remote_client_without_auth_when_insecure() -> None:
    answer = _call("store", REMOTE, "--insecure")
    assert answer["call"]["code"] == "OK"
    assert answer["startup"] == ["insecure"]


@netns_only
def test_store_serves_a_loopback_client_without_auth() -> None:
    assert _call("store", LOOPBACK)["call"]["code"] == "OK"


@netns_only
def test_inference_refuses_a_remote_client_without_auth_naming_the_fix() -> None:
    _assert_refused_naming_the_fix(_call("inference", REMOTE)["call"])


@netns_only
def test_inference_serves_a_remote_client_with_a_token() -> None:
    answer = _call("inference", REMOTE, f"--reader-token={TOKEN}", token=TOKEN)
    assert answer["call"]["code"] == "OK"


@netns_only
def test_openai_front_answers_401_to_a_remote_client_without_auth() -> None:
    models = _call("openai", REMOTE)["models"]
    assert models["status"] == 401
    assert "--insecure" in models["body"]["error"]["message"]


@netns_only
def test_openai_front_refuses_a_remote_client_claiming_loopback_in_x_forwarded_for() -> None:
    # uvicorn would believe the header from any peer where FORWARDED_ALLOW_IPS is "*".
    claim = {"FORWARDED_ALLOW_IPS": "*", "LORASERVE_TEST_FORWARDED_FOR": LOOPBACK}
    assert _call("openai", REMOTE, env=claim)["models"]["status"] == 401


@netns_only
def test_openai_front_serves_a_loopback_client_without_auth() -> None:
    assert _call("openai", LOOPBACK)["models"]["status"] == 200


def _native_without_auth(listen: str) -> InferenceSettings:
    argv = ["serve", "--model=m", "--store=127.0.0.1:1", f"--listen={listen}"]
    return parse_settings([*argv, "--grpc-transport=native"], {}, "replica")


@native_only
async def test_native_transport_refuses_to_start_on_a_remote_address_without_auth() -> None:
    # Refused before it binds: nothing listens on this host's other addresses.
    with pytest.raises(FailedPrecondition, match=r"loopback address only.*--insecure"):
        await start_grpc_front(_native_without_auth("0.0.0.0:0"), RuntimeRef())


@native_only
async def test_native_transport_starts_on_a_loopback_address_without_auth() -> None:
    front = await start_grpc_front(_native_without_auth("127.0.0.1:0"), RuntimeRef())
    try:
        assert front.transport == "native"
    finally:
        await front.stop(None)


@pytest.mark.parametrize("parser", [store_parser, build_parser], ids=["adapterstore", "inference"])
def test_serve_help_shows_insecure_and_why(
    parser: Callable[[Mapping[str, str]], argparse.ArgumentParser],
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parser({}).parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    insecure = re.search(r"--insecure (.*?\))", help_text)
    assert insecure is not None
    assert "loopback clients only (protected mode)" in insecure.group(1)
