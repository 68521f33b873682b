"""Where a server serves its Prometheus metrics, and serving them there.

Metrics name every adapter and its traffic and carry no authentication, so they listen
on the service's own host by default, not on every interface: `--metrics-port PORT`
binds the host of the server's `--listen` (its gRPC address), `--metrics-listen
HOST:PORT` any other address (`0.0.0.0:9102` for a scraper on another host). A server in
protected mode (no authentication configured) binds `--metrics-port` to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import logging

from prometheus_client import CollectorRegistry, start_http_server

from loraserve.common.config.flags import EnvFlags, port
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.protected import is_loopback_host

log = logging.getLogger(__name__)


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
    server, _ = start_http_server(number, addr=host or "0.0.0.0", registry=registry)
    bound = int(server.server_port)
    log.info("metrics.serving address=%s port=%d", host, bound)
    return bound
