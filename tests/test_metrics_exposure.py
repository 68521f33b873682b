"""Where metrics are served and who may read them: the metrics port on the service's own
host (or the address given), and /metrics on the OpenAI port behind the API's token.

Real servers on loopback addresses. Where a port is bound is read from this process's
listening sockets: trying to connect to the same port number on another address could
reach another test's server that happens to have it there.
"""

from __future__ import annotations

import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client import CollectorRegistry

from loraserve.adapterstore.settings import parse_settings as parse_store_settings
from loraserve.common.rpc.security import ServerSecurity, Token
from loraserve.inference.app import InferenceApp
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.openai import RunningHttpServer, create_openai_app, start_http_server
from loraserve.inference.serving import RuntimeRef
from loraserve.inference.settings import parse_settings

TOKEN = "metrics-test-token"
# Nothing listens here: the app's store client connects lazily and these tests never sync.
NO_STORE = "127.0.0.1:1"


def bound_addresses(port: int) -> set[str]:
    """The addresses this process listens on at `port`."""
    return {
        c.laddr.ip
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def scrape(host: str, port: int) -> bytes:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
        return body


StartApp = Callable[..., Awaitable[InferenceApp]]


@pytest.fixture
async def started_app(tmp_path: Path) -> AsyncIterator[StartApp]:
    apps: list[InferenceApp] = []

    async def start(*flags: str) -> InferenceApp:
        argv = ["serve", "--model", str(tmp_path / "model"), "--store", NO_STORE]
        argv += ["--adapter-cache", str(tmp_path / "cache"), *flags]
        app = InferenceApp(parse_settings(argv, {}, "replica"))
        await app.start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        await app.stop()


async def test_metrics_port_listens_on_the_grpc_listen_host_only(started_app: StartApp) -> None:
    app = await started_app("--listen", "127.0.0.1:0", "--metrics-port", "0")
    assert app.metrics_port is not None
    assert b"loraserve_inference_requests" in scrape("127.0.0.1", app.metrics_port)
    assert bound_addresses(app.metrics_port) == {"127.0.0.1"}


async def test_metrics_listen_binds_the_address_given(started_app: StartApp) -> None:
    app = await started_app("--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.2:0")
    assert app.metrics_port is not None
    assert b"loraserve_inference_requests" in scrape("127.0.0.2", app.metrics_port)
    assert bound_addresses(app.metrics_port) == {"127.0.0.2"}


def test_store_metrics_port_takes_the_store_listen_host() -> None:
    base = ["serve", "--bucket", "b", "--listen", "127.0.0.1:50051"]
    settings = parse_store_settings([*base, "--metrics-port", "9101"], {})
    assert settings.metrics_listen == "127.0.0.1:9101"
    settings = parse_store_settings([*base, "--metrics-listen", "0.0.0.0:9101"], {})
    assert settings.metrics_listen == "0.0.0.0:9101"


def test_metrics_port_binds_loopback_in_protected_mode_and_the_listen_host_otherwise() -> None:
    base = ["serve", "--bucket", "b", "--listen", "0.0.0.0:50051", "--metrics-port", "9101"]
    assert parse_store_settings(base, {}).metrics_listen == "127.0.0.1:9101"
    assert parse_store_settings([*base, "--insecure"], {}).metrics_listen == "0.0.0.0:9101"
    tokens = parse_store_settings([*base, "--reader-token", "t"], {})
    assert tokens.metrics_listen == "0.0.0.0:9101"
    explicit = [*base[:-2], "--metrics-listen", "0.0.0.0:9101"]
    assert parse_store_settings(explicit, {}).metrics_listen == "0.0.0.0:9101"


def test_inference_metrics_port_binds_loopback_in_protected_mode() -> None:
    argv = ["serve", "--model", "m", "--store", "s:1", "--listen", "0.0.0.0:50052"]
    settings = parse_settings([*argv, "--metrics-port", "9102"], {}, "r")
    assert settings.metrics_listen == "127.0.0.1:9102"


async def http_front(public_metrics: bool) -> RunningHttpServer:
    security = ServerSecurity(reader_tokens=(Token("reader", TOKEN),))
    app = create_openai_app(
        RuntimeRef(),
        model_names=["m"],
        security=security,
        is_ready=lambda: True,
        metrics=InferenceMetrics(CollectorRegistry()).registry,
        # Closed is the default.
        **({"public_metrics": True} if public_metrics else {}),
    )
    return await start_http_server(app, address="127.0.0.1:0", security=ServerSecurity())


async def test_metrics_on_the_openai_port_take_the_token() -> None:
    server = await http_front(public_metrics=False)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            assert (await http.get("/metrics")).status_code == 401
            authorized = await http.get("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
            assert authorized.status_code == 200
            assert "loraserve_inference_requests" in authorized.text
    finally:
        await server.stop(grace=None)


async def test_public_metrics_opens_them_on_the_openai_port() -> None:
    server = await http_front(public_metrics=True)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            assert (await http.get("/metrics")).status_code == 200
            assert (await http.get("/v1/models")).status_code == 401
    finally:
        await server.stop(grace=None)
