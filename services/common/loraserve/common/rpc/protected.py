"""Protected mode, after Redis': a server with no authentication configured (no token
and no client-certificate CA) serves loopback clients only, so that a default start on
0.0.0.0 does not hand every adapter to whoever can reach the port. `--insecure` turns it
off. Health and reflection stay open to all, for load balancers and probes.

Whether a caller is local is read from what the server reports of its peer; anything
that does not parse as a loopback address or a Unix socket counts as remote: protected
mode fails closed.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any
from urllib.parse import unquote

import grpc

from loraserve.common.errors import Unauthenticated
from loraserve.common.rpc.grpcutil import Guard
from loraserve.common.rpc.security import OPEN_METHOD_PREFIXES, ServerSecurity

log = logging.getLogger(__name__)

HOW_TO_OPEN = (
    "configure tokens (--writer-token/--reader-token or their files/env) or "
    "--tls-client-ca, or pass --insecure to serve every address without authentication"
)


def is_loopback_host(host: str) -> bool:
    """Whether `host` is a loopback IP address: 127.0.0.0/8, ::1 or IPv4-mapped
    ::ffff:127.x, bracketed or not. A name, even "localhost", is not: what it resolves
    to is not this check's to know."""
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        # Python before 3.13 calls ::ffff:127.0.0.1 not loopback.
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def peer_host(peer: str) -> str:
    """The address in a grpcio peer, `ipv4:HOST:PORT` or `ipv6:[HOST]:PORT` (grpcio 1.85
    sends the latter URL-encoded: `ipv6:%5B::1%5D:PORT`); any other peer as it is."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    return unquote(rest).rpartition(":")[0].removeprefix("[").removesuffix("]")


def is_local_peer(peer: str) -> bool:
    """Whether a grpcio peer is on this host: a loopback address or a Unix socket (only
    processes here can reach one; grpcio reports it as `unix:`, path or not)."""
    if peer.startswith(("unix:", "unix-abstract:")):
        return True
    return peer.startswith(("ipv4:", "ipv6:")) and is_loopback_host(peer_host(peer))


def refusal(client: str) -> Unauthenticated:
    """The error a remote caller gets in protected mode; `client` names where it came from."""
    return Unauthenticated(
        "protected mode: this server has no authentication configured, so it serves "
        f"loopback clients only (this call came from {client}); {HOW_TO_OPEN}"
    )


def loopback_guard_for(method: str) -> Guard | None:
    """The check protected mode puts before `method` (see `ErrorMappingInterceptor`)."""
    if method.startswith(OPEN_METHOD_PREFIXES):
        return None
    return _require_local_peer


async def _require_local_peer(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    peer = context.peer() or ""
    if not is_local_peer(peer):
        raise refusal(peer_host(peer) or repr(peer))


def log_exposure(security: ServerSecurity, address: str) -> None:
    """Says at start-up, as a warning, who may call a server that checks no token."""
    if security.auth_enabled:
        return
    if security.loopback_only:
        log.warning(
            "server.protected_mode address=%s: no authentication configured, so only "
            "loopback clients are served; to serve others, %s",
            address,
            HOW_TO_OPEN,
        )
    elif security.tls_client_ca_file is None:
        log.warning(
            "server.insecure address=%s: --insecure: EVERY address that reaches this "
            "server may call it without authentication",
            address,
        )
    else:
        log.warning(
            "server.auth_disabled address=%s: no tokens configured; any client with a "
            "certificate from --tls-client-ca may call everything",
            address,
        )
