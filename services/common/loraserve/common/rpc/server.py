"""Starting and stopping a grpc.aio server the same way for both services:
error mapping, bearer auth or protected mode, TLS, health checking and reflection."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from loraserve.common.config.sizes import MESSAGE_LIMIT_OPTIONS
from loraserve.common.errors import Unavailable
from loraserve.common.rpc.auth import TokenAuth
from loraserve.common.rpc.grpcutil import ErrorMappingInterceptor
from loraserve.common.rpc.limits import ServerLimits
from loraserve.common.rpc.protected import log_exposure, loopback_guard_for
from loraserve.common.rpc.security import Role, ServerSecurity

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class RunningServer:
    """A started server, the port it bound and its health servicer."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]

    async def set_serving(self, serving: bool) -> None:
        """Sets the overall and per-service health status."""
        status = SERVING if serving else NOT_SERVING
        for name in ("", *self.service_names):
            await self.health.set(name, status)

    async def stop(self, grace: float | None) -> None:
        """Reports NOT_SERVING, then lets in-flight calls finish within `grace` seconds."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


async def start_server(
    *,
    address: str,
    register: Callable[[grpc.aio.Server], None],
    service_names: Sequence[str],
    security: ServerSecurity,
    needs: Mapping[str, Role] | None = None,
    limits: ServerLimits | None = None,
    options: Sequence[tuple[str, Any]] = (),
    max_connection_age_s: float | None = None,
) -> RunningServer:
    """Starts a server on `address` (port 0 picks a free one), NOT_SERVING until told.

    `register` adds the service's servicers; `service_names` are their full names
    for health and reflection; `limits` bound what its peers may hold (the defaults without). With
    `max_connection_age_s`, each connection is asked
    to close (GOAWAY; gRPC jitters the age by 10 %) once that old: its calls finish on
    it, new ones go to a new connection, for which a client resolves its target again
    (`dns:///` clients re-resolve only when a connection ends, so without this they
    never see replicas added after they connected).
    """
    log_exposure(security, address)
    limits = limits or ServerLimits()
    auth = None if security.loopback_only else TokenAuth(security, needs)
    interceptor = ErrorMappingInterceptor(
        auth.guard_for if auth is not None else loopback_guard_for,
        check_headers=auth.check_headers if auth is not None else None,
        stalled_write_s=limits.stalled_write_s,
    )
    age = (
        [("grpc.max_connection_age_ms", max(1, round(max_connection_age_s * 1000)))]
        if max_connection_age_s
        else []
    )
    server = grpc.aio.server(
        interceptors=[interceptor],
        options=[*MESSAGE_LIMIT_OPTIONS, *limits.grpc_options(), *age, *options],
        maximum_concurrent_rpcs=limits.max_calls or None,
    )
    register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    credentials = security.server_credentials()
    try:
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise Unavailable(f"cannot listen on {address}: {exc}") from exc
    running = RunningServer(server, port, health_servicer, tuple(service_names))
    await running.set_serving(False)
    await server.start()
    log.info("server.started address=%s port=%d tls=%s", address, port, credentials is not None)
    return running


def install_stop_signals(stop: asyncio.Event) -> None:
    """Sets `stop` on SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
