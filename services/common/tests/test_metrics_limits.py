"""The metrics port bounds its peers: a connection that says nothing is dropped after the
timeout, and one address holds at most MAX_PER_PEER of the server's threads, the rest
closed as they are accepted; a scrape still answers afterwards. Over real HTTP."""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from loraserve.common.rpc import metrics_http
from loraserve.common.rpc.metrics_http import MAX_PER_PEER, serve_metrics
from loraserve.testing.abuse import closed_by_server
from loraserve.testing.waiting import eventually


def _serve() -> int:
    registry = CollectorRegistry()
    Counter("abuse_probe", "a metric to scrape", registry=registry).inc()
    return serve_metrics(registry, "127.0.0.1:0")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def test_connections_past_one_peers_share_are_closed_as_they_are_accepted() -> None:
    port = _serve()
    threads_before = threading.active_count()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_PER_PEER + 12)]
    try:
        await eventually(
            lambda: sum(closed_by_server(sock) for sock in idle) >= 12, "the extra ones closed"
        )
        assert threading.active_count() - threads_before <= MAX_PER_PEER
    finally:
        for sock in idle:
            sock.close()


async def test_a_connection_that_says_nothing_is_dropped_and_scrapes_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_http._QuietHandler, "timeout", 0.5)
    port = _serve()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_PER_PEER)]
    try:
        await eventually(lambda: all(closed_by_server(sock) for sock in idle), "every one dropped")
    finally:
        for sock in idle:
            sock.close()
    assert "abuse_probe_total 1.0" in _scrape(port)
