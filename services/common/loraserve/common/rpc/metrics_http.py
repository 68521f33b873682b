"""Where a server serves its Prometheus metrics, and serving them there.

Metrics name every adapter and its traffic and carry no authentication, so they listen
on the service's own host by default, not on every interface: `--metrics-port PORT`
binds the host of the server's `--listen` (its gRPC address), `--metrics-listen
HOST:PORT` any other address (`0.0.0.0:9102` for a scraper on another host). A server in
protected mode (no authentication configured) binds `--metrics-port` to 127.0.0.1.

The server is prometheus_client's (a thread per connection, off the event loop, so a
busy loop still answers scrapes) with the limits it lacks: a scrape comes from a few
scrapers, so a connection has `TIMEOUT_S` for each read and write, at most
`MAX_PER_PEER` connections of one address and `MAX_CONNECTIONS` in all are served at
once, and any more are closed as they are accepted.
"""

from __future__ import annotations

import argparse
import logging
import socket
import socketserver
import sys
import threading
from collections import Counter
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from loraserve.common.config.flags import EnvFlags, port
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.protected import is_loopback_host

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
MAX_PER_PEER = 8


def split_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6HOST]:PORT` into its parts; raises InvalidArgument."""
    host, sep, number = address.rpartition(":")
    if not sep or not number.isdigit() or int(number) > 65535:
        raise InvalidArgument(f"address {address!r} must be HOST:PORT")
    return host.removeprefix("[").removesuffix("]"), int(number)


def add_metrics_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flags: EnvFlags
) -> None:
    """`--metrics-listen` and `--metrics-port`, each with its environment fallback."""
    flags.add(
        parser,
        "metrics-listen",
        "serve Prometheus metrics (/metrics, no token) on this HOST:PORT (port 0: any free "
        "port); unset: see --metrics-port",
        metavar="HOST:PORT",
    )
    flags.add(
        parser,
        "metrics-port",
        "serve Prometheus metrics on this port of --listen's host (0: any free port); "
        "unset with --metrics-listen unset: off",
        type=port,
    )


def metrics_address(
    args: argparse.Namespace, listen: str, *, loopback_only: bool = False
) -> str | None:
    """The address metrics listen on, from the flags `add_metrics_flags` added; None: off.
    With `loopback_only` (the server is in protected mode: nothing authenticates its
    callers), `--metrics-port` binds 127.0.0.1 whatever --listen's host; an explicit
    `--metrics-listen` is taken as given."""
    if args.metrics_listen and args.metrics_port is not None:
        raise InvalidArgument("give --metrics-listen or --metrics-port, not both")
    if args.metrics_listen:
        split_address(args.metrics_listen)
        return str(args.metrics_listen)
    if args.metrics_port is None:
        return None
    host, _ = split_address(listen)
    if loopback_only and not is_loopback_host(host):
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    return f"{shown}:{int(args.metrics_port)}"


def serve_metrics(registry: CollectorRegistry, address: str) -> int:
    """Serves `registry` at /metrics on `address` in a daemon thread; the bound port."""
    host, number = split_address(address)
    host = host or "0.0.0.0"
    family = socket.getaddrinfo(host, number, type=socket.SOCK_STREAM)[0][0]
    server_class = type("MetricsServer", (_BoundedServer,), {"address_family": family})
    server: WSGIServer = make_server(
        host, number, make_wsgi_app(registry), server_class, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    bound = int(server.server_port)
    log.info("metrics.serving address=%s port=%d", host, bound)
    return bound


class _QuietHandler(WSGIRequestHandler):
    # socketserver applies it to the connection: a peer that sends or reads nothing for
    # this long is dropped, its thread freed.
    timeout = TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged, as prometheus_client's own server does not."""


class _BoundedServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.Lock()
        self._served: Counter[str] = Counter()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = str(client_address[0])
        with self._lock:
            admitted = self._served.total() < MAX_CONNECTIONS and self._served[peer] < MAX_PER_PEER
            if admitted:
                self._served[peer] += 1
        if not admitted:
            log.info("metrics.connection_refused peer=%s", peer)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(str(client_address[0]))

    def _release(self, peer: str) -> None:
        with self._lock:
            self._served[peer] -= 1
            if not self._served[peer]:
                del self._served[peer]

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that timed out or went away is its own business, not a traceback."""
        log.debug(
            "metrics.connection_failed peer=%s reason=%r", client_address[0], sys.exc_info()[1]
        )
