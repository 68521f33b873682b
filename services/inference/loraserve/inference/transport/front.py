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
from loraserve.common.rpc.protected import HOW_TO_OPEN, is_loopback_host
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
    # Set once the native transport can serve no call (its NativeFront's on_failure).
    failed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def port(self) -> int:
        return self.native.port if self.native is not None else self.server.port

    @property
    def transport(self) -> str:
        """What serves Generate: "native" or "grpcio"."""
        return "native" if self.native is not None else "grpcio"

    async def set_serving(self, serving: bool) -> None:
        await self.server.set_serving(serving and not self.failed.is_set())

    async def failure(self) -> str:
        """Waits until the native transport can serve no call, and says why; never
        returns on grpc.aio alone. The owner stops the front: its health is NOT_SERVING
        from the moment the stop begins."""
        await self.failed.wait()
        return (self.native.failure if self.native is not None else None) or "unknown"

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
    only when asked for by name, and then where it cannot (not built, or an address that
    is not HOST:PORT) it raises, naming why. "auto" is grpc.aio until the native
    transport bounds streams, bodies and time and keeps a peer's fault inside its
    connection, as grpc.aio does (a request HEADERS frame carrying `:status` stops its
    every call: h2 0.3.13 panics on it)."""
    if transport != "native":
        return False
    try:
        native.load_native()
        split_address(listen)
    except (ImportError, InvalidArgument) as exc:
        why = exc.message if isinstance(exc, InvalidArgument) else str(exc)
        raise FailedPrecondition(f"--grpc-transport native: {why}") from exc
    return True


def _check_native_protected(settings: InferenceSettings) -> None:
    """Raises unless the native transport can serve `settings.listen` as protected mode
    wants: the grpc.aio server behind it sees every caller as its Unix socket, so with
    no authentication it may listen on a loopback address only."""
    host, _ = split_address(settings.listen)
    if settings.security.loopback_only and not is_loopback_host(host):
        raise FailedPrecondition(
            "--grpc-transport native: the native transport cannot tell loopback clients "
            "from others, so with no authentication (protected mode) it may listen on a "
            f"loopback address only, not {settings.listen}; {HOW_TO_OPEN}, or use "
            "--grpc-transport grpcio"
        )


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
            limits=settings.limits,
            max_connection_age_s=max_age_s,
        )

    listen, age_s = settings.listen, settings.max_connection_age_s
    if not native_wanted(settings.grpc_transport, listen):
        return GrpcFront(await start(listen, settings.security, age_s))
    _check_native_protected(settings)
    host, port = split_address(listen)
    socket_dir = make_socket_dir()
    upstream = f"unix:{socket_dir / 'grpc.sock'}"
    # Plaintext, with the same tokens: TLS ends at the transport. No connection age: the
    # transport renews its connections to this server itself, and ages the clients'. The
    # client CA stays: without a certificate of its own the server asks for none, and
    # the CA keeps protected mode off there as on the transport, which checks them.
    plain = dataclasses.replace(settings.security, tls_cert_file=None, tls_key_file=None)
    server: RunningServer | None = None
    failed = asyncio.Event()
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
            on_failure=lambda _: failed.set(),
        )
    except BaseException as exc:
        if server is not None:
            await server.stop(None)
        shutil.rmtree(socket_dir, ignore_errors=True)
        if isinstance(exc, (OSError, ValueError)):
            raise Unavailable(f"cannot listen on {listen}: {exc}") from exc
        raise
    log.info("server.native_transport address=%s port=%d upstream=%s", listen, front.port, upstream)
    return GrpcFront(server, front, socket_dir, failed)
