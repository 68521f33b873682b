"""Runs an ASGI app with uvicorn inside the caller's event loop, beside the gRPC server.

The socket is bound before this returns, so a bad address fails start-up at once and
port 0 reports the port it got. Signals stay with the owning process: uvicorn's own
handlers would replace the server's, and the owner stops both servers together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from loraserve.common.errors import Unavailable
from loraserve.common.rpc.metrics_http import split_address
from loraserve.common.rpc.security import ServerSecurity

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RunningHttpServer:
    """A uvicorn server serving on `port` until `stop`."""

    port: int
    server: uvicorn.Server
    task: asyncio.Task[None]
    # The listening socket: the options every accepted connection inherits.
    listening: socket.socket

    async def stop(self, grace: float | None) -> None:
        """Stops accepting; running requests get `grace` seconds (None: all they need)."""
        self.server.config.timeout_graceful_shutdown = None if grace is None else math.ceil(grace)
        self.server.should_exit = True
        await asyncio.gather(self.task, return_exceptions=True)
        log.info("http.stopped port=%d", self.port)


async def start_http_server(
    app: Any,
    *,
    address: str,
    security: ServerSecurity,
    name: str = "http",
    stalled_write_s: float | None = None,
) -> RunningHttpServer:
    """Serves `app` on `address` (port 0 picks a free one), with the server's TLS settings.
    With `stalled_write_s`, the kernel drops a connection whose peer has acknowledged
    none of what was sent to it for twice that long (TCP_USER_TIMEOUT, zero windows
    included): the app's own clock ends the response first, and the kernel's bounds what
    no clock of the app sees (a response already handed to the socket, its close
    waiting for the buffer to drain)."""
    sock = _bind(address, 2 * stalled_write_s if stalled_write_s is not None else None)
    config = uvicorn.Config(
        app,
        log_config=None,
        lifespan="off",
        access_log=False,
        # uvicorn would otherwise take the client's address from X-Forwarded-For when the
        # peer is in FORWARDED_ALLOW_IPS (its own environment variable): with that set to
        # "*", any remote caller could claim 127.0.0.1 and pass protected mode.
        proxy_headers=False,
        ssl_certfile=security.tls_cert_file,
        ssl_keyfile=security.tls_key_file,
        ssl_ca_certs=security.tls_client_ca_file,
        ssl_cert_reqs=ssl.CERT_REQUIRED if security.tls_client_ca_file else ssl.CERT_NONE,
    )
    try:
        # Loaded here, so unreadable certificates fail start-up instead of the task.
        config.load()
    except Exception:
        sock.close()
        raise
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name=name)
    task.add_done_callback(_log_failure)
    port = int(sock.getsockname()[1])
    log.info(
        "http.listening name=%s address=%s port=%d tls=%s", name, address, port, bool(config.ssl)
    )
    return RunningHttpServer(port, server, task, sock)


def _bind(address: str, user_timeout_s: float | None) -> socket.socket:
    host, port = split_address(address)
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise Unavailable(f"cannot listen on {address}: {exc}") from exc
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if user_timeout_s is not None and hasattr(socket, "TCP_USER_TIMEOUT"):
            # Accepted connections inherit it.
            milliseconds = max(1, round(user_timeout_s * 1000))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, milliseconds)
        sock.bind(sockaddr)
        # Listening now: connections made before uvicorn's loop starts wait in the backlog.
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot listen on {address}: {exc.strerror}") from exc
    return sock


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("http.failed name=%s", task.get_name(), exc_info=task.exception())
