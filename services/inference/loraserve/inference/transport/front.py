"""The inference service's gRPC server, on whichever transport serves Generate: grpc.aio
alone, or the native transport on the service's address with the grpc.aio server behind
it on a Unix socket of its own, serving every other call (`--grpc-transport`)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import shutil
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path

from loraserve.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from loraserve.common.rpc.metrics_http import split_address
from loraserve.common.rpc.security import ServerSecurity
from loraserve.common.rpc.server import RunningServer, start_server
from loraserve.inference.serving import SERVICE_NAME, RuntimeRef, register
from loraserve.inference.settings import InferenceSettings
from loraserve.inference.transport import native
from loraserve.inference.transport.generate import start_generate_front
from loraserve.inference.transport.sockets import make_socket_dir

log = logging.getLogger(__name__)


@dataclass
class GrpcFront:
    """A started gRPC server: grpc.aio's, and the native transport before it, if any."""

    server: RunningServer
    native: native.NativeFront | None = None
    # The grpc.aio server's socket directory behind the native transport.
    socket_dir: Path | None = None

    @property
    def port(self) -> int:
        return self.native.port if self.native is not None else self.server.port

    @property
    def transport(self) -> str:
        """What serves Generate: "native" or "grpcio"."""
        return "native" if self.native is not None else "grpcio"

    async def set_serving(self, serving: bool) -> None:
        await self.server.set_serving(serving)

    async def stop(self, grace: float | None) -> None:
        """NOT_SERVING, then the calls in flight get `grace` seconds on either server. Both
        stop however the other's stop ends; the first error is raised after."""
        stopping = [self.server.stop(grace)]
        if self.native is not None:
            stopping.append(self.native.stop(grace))
        try:
            results = await asyncio.gather(*stopping, return_exceptions=True)
        finally:
            if self.native is not None:
                self.native.close()
            if self.socket_dir is not None:
                shutil.rmtree(self.socket_dir, ignore_errors=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result


def native_wanted(transport: str, listen: str) -> bool:
    """Whether Generate goes on the native transport (`--grpc-transport`) on `listen`:
    "native" where it cannot (not built, or an address that is not HOST:PORT) raises,
    naming why; "auto" falls back to grpc.aio, saying so."""
    if transport == "grpcio":
        return False
    try:
        native.load_native()
        split_address(listen)
    except (ImportError, InvalidArgument) as exc:
        why = exc.message if isinstance(exc, InvalidArgument) else str(exc)
        if transport == "native":
            raise FailedPrecondition(f"--grpc-transport native: {why}") from exc
        log.warning("server.native_transport_unavailable falling_back=grpcio reason=%s", why)
        return False
    return True


async def start_grpc_front(settings: InferenceSettings, runtime_ref: RuntimeRef) -> GrpcFront:
    """Listens on `settings.listen`, NOT_SERVING until told."""

    def start(
        address: str, security: ServerSecurity, max_age_s: float | None
    ) -> Awaitable[RunningServer]:
        return start_server(
            address=address,
            register=lambda server: register(server, runtime_ref),
            service_names=[SERVICE_NAME],
            security=security,
            max_connection_age_s=max_age_s,
        )

    listen, age_s = settings.listen, settings.max_connection_age_s
    if not native_wanted(settings.grpc_transport, listen):
        return GrpcFront(await start(listen, settings.security, age_s))
    host, port = split_address(listen)
    socket_dir = make_socket_dir()
    upstream = f"unix:{socket_dir / 'grpc.sock'}"
    # Plaintext, with the same tokens: TLS ends at the transport. No connection age: the
    # transport renews its connections to this server itself, and ages the clients'.
    plain = dataclasses.replace(
        settings.security, tls_cert_file=None, tls_key_file=None, tls_client_ca_file=None
    )
    server: RunningServer | None = None
    try:
        server = await start(upstream, plain, None)
        front = start_generate_front(
            runtime_ref,
            host=host or "0.0.0.0",
            port=port,
            security=settings.security,
            upstream=upstream,
            max_connection_age_s=age_s,
            pushed=True,
        )
    except BaseException as exc:
        if server is not None:
            await server.stop(None)
        shutil.rmtree(socket_dir, ignore_errors=True)
        if isinstance(exc, (OSError, ValueError)):
            raise Unavailable(f"cannot listen on {listen}: {exc}") from exc
        raise
    log.info("server.native_transport address=%s port=%d upstream=%s", listen, front.port, upstream)
    return GrpcFront(server, front, socket_dir)
