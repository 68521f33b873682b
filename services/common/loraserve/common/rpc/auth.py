"""Who a caller is and what it may do, from what its credential proves.

A caller proves a role with a bearer token (`PRINCIPAL:TOKEN`: the principal is the
token's, not the caller's to choose) or, for an inference replica talking to the store,
with a client certificate whose URI SAN names it under the server's replica prefix
(SPIFFE style: `spiffe://loraserve/replica/<id>`). Nothing a caller writes in a request
adds to that: a replica's reports are accepted for the replica its credential names
only (`reporting_identity`).

Roles grant others: admin ⊇ writer ⊇ reader; replica and pinner each ⊇ reader.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc

from loraserve.common.errors import PermissionDenied, Unauthenticated
from loraserve.common.rpc.security import (
    OPEN_METHOD_PREFIXES,
    REPLICA_ID_PATTERN,
    Role,
    ServerSecurity,
    current_principal,
    current_role,
)

_GRANTS: Mapping[Role, frozenset[Role]] = {
    Role.READER: frozenset({Role.READER}),
    Role.WRITER: frozenset({Role.READER, Role.WRITER}),
    Role.ADMIN: frozenset({Role.READER, Role.WRITER, Role.ADMIN}),
    Role.REPLICA: frozenset({Role.READER, Role.REPLICA}),
    Role.PINNER: frozenset({Role.READER, Role.PINNER}),
}
# Which role a caller acts in when its credential proves several and the method needs
# no particular one: the most powerful, so audit fields name the strongest principal.
_PREFERENCE = (Role.ADMIN, Role.WRITER, Role.REPLICA, Role.PINNER, Role.READER)

Guard = Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]]


def grants(role: Role, needed: Role) -> bool:
    """Whether a caller in `role` may call a method that needs `needed`."""
    return needed in _GRANTS[role]


def reporting_identity() -> str | None:
    """The replica the current caller's credential names, which its reports must be
    about; None where the server authenticates nobody (loopback-only or --insecure),
    which trusts every caller alike."""
    role = current_role.get()
    return None if role is None else current_principal.get()


class TokenAuth:
    """Checks a caller's credential against the role each method needs (`needs`:
    method -> role; every other method needs a reader). Bearer tokens come from
    `authorization: Bearer <token>`; a verified client certificate whose URI SAN starts
    with `security.replica_uri_prefix` proves the replica role for the named replica."""

    def __init__(
        self,
        security: ServerSecurity,
        needs: Mapping[str, Role] | None = None,
        *,
        carrier: str = "metadata",
    ) -> None:
        """`carrier` names where the token travels in refusals: gRPC metadata, or the
        HTTP front's header."""
        self._carrier = carrier
        self._tokens = [(t, role) for role, tokens in security.tokens.items() for t in tokens]
        self._needs = dict(needs or {})
        self._replica_prefix = security.replica_uri_prefix
        self._mtls = security.tls_client_ca_file is not None

    def guard_for(self, method: str) -> Guard | None:
        if method.startswith(OPEN_METHOD_PREFIXES):
            return None
        needed = self._needs.get(method, Role.READER)
        if not self._tokens:
            return self._certificate_guard(method, needed) if self._mtls else None

        async def guard(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            matches = self._matches(context.invocation_metadata() or (), _peer_uris(context))
            usable = [role for role in _PREFERENCE if role in matches and grants(role, needed)]
            if not usable:
                raise PermissionDenied(
                    f"{method} needs {_a(needed.name.lower())} token"
                    + (
                        f" or a client certificate naming the replica ({self._replica_prefix}ID)"
                        if needed is Role.REPLICA
                        else ""
                    )
                )
            role = needed if needed in matches else usable[0]
            current_principal.set(matches[role])
            current_role.set(role)

        return guard

    def check_headers(self, method: str, metadata: Iterable[Any]) -> None:
        """Raises Unauthenticated for a call that carries no token valid here where a
        token is the only credential (no mTLS): decided from its HEADERS, so the server
        reads none of an unauthenticated caller's request. Roles are checked later, by
        the method's guard."""
        if self._tokens and not self._mtls and not method.startswith(OPEN_METHOD_PREFIXES):
            self._matches(metadata, ())

    def _certificate_guard(self, method: str, needed: Role) -> Guard | None:
        """With mTLS and no token, every certified caller is authenticated and may read.
        A certificate naming a replica proves that replica and nothing more: it reports
        for itself and reads; any other certificate may do the rest (the operator's,
        a CI job's), but never report."""
        if needed is Role.READER:
            return None

        async def guard(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            uris = _peer_uris(context)
            replicas = self._replicas_named(uris)
            if needed is Role.REPLICA:
                if len(replicas) != 1:
                    raise PermissionDenied(
                        f"{method} needs a client certificate naming one replica "
                        f"({self._replica_prefix}ID)"
                    )
                current_principal.set(replicas[0])
                current_role.set(Role.REPLICA)
                return
            if replicas:
                raise PermissionDenied(
                    f"{method} needs {_a(needed.name.lower())} credential: a replica's "
                    "certificate may only read and report"
                )
            current_principal.set(uris[0] if uris else _common_name(context))
            current_role.set(Role.ADMIN)

        return guard

    def authenticate(self, metadata: Iterable[Any]) -> tuple[str, Role]:
        """The principal and role an `authorization` entry grants, also set as the
        current caller; raises Unauthenticated. For fronts other than grpc.aio (the HTTP
        front, the native transport), which pass their headers here."""
        matches = self._matches(metadata, ())
        role = next(role for role in _PREFERENCE if role in matches)
        current_principal.set(matches[role])
        current_role.set(role)
        return matches[role], role

    def _matches(self, metadata: Iterable[Any], peer_uris: Iterable[str]) -> dict[Role, str]:
        """The principal per role the caller's credentials prove; raises Unauthenticated."""
        matches: dict[Role, str] = {}
        replicas = self._replicas_named(peer_uris)
        if len(replicas) == 1:
            matches[Role.REPLICA] = replicas[0]
        header = next((value for key, value in metadata if key == "authorization"), None)
        if header is None:
            if matches:
                return matches
            raise Unauthenticated(f"missing 'authorization: Bearer <token>' {self._carrier}")
        scheme, _, presented = str(header).partition(" ")
        if scheme.lower() != "bearer" or not presented:
            raise Unauthenticated(f"authorization {self._carrier} must be 'Bearer <token>'")
        found = False
        # Compare against every token, so timing does not reveal which one matched.
        for token, role in self._tokens:
            if hmac.compare_digest(token.secret.encode(), presented.encode()):
                found = True
                matches.setdefault(role, token.principal)
        if not found:
            raise Unauthenticated("invalid bearer token")
        return matches

    def _replicas_named(self, peer_uris: Iterable[str]) -> list[str]:
        """The replicas a certificate's URIs name; one that names several proves none."""
        return [
            uri.removeprefix(self._replica_prefix)
            for uri in peer_uris
            if uri.startswith(self._replica_prefix)
            and REPLICA_ID_PATTERN.fullmatch(uri.removeprefix(self._replica_prefix))
        ]


def _a(noun: str) -> str:
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


def _common_name(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    names = list(context.auth_context().get("x509_common_name", ()))
    return names[0].decode("utf-8", "replace") if names else "anonymous"


def _peer_uris(context: grpc.aio.ServicerContext[Any, Any]) -> list[str]:
    """The URI SANs of the caller's verified certificate (none without mTLS)."""
    found = context.auth_context().get("peer_uri", ())
    return [uri.decode("utf-8", "replace") for uri in found]
