"""Bearer-token roles and TLS for both servers and their clients.

Tokens are given as `TOKEN` or `PRINCIPAL:TOKEN` (principal names who pushed a
revision). Every role may read; writer tokens also change what is served, replica
tokens (the adapter store's inference replicas) also report what they serve, and
neither can do the other's calls. With no token and no client-certificate CA configured,
the servers serve loopback clients only (protected mode, see `protected`) unless told
`--insecure`. Secrets never appear in reprs or logs.
"""

from __future__ import annotations

import argparse
import contextvars
import enum
import hmac
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from loraserve.common.config.flags import EnvFlags
from loraserve.common.errors import InvalidArgument, PermissionDenied, Unauthenticated

# Set for the duration of an authenticated call; read by servicers for audit fields.
current_principal: contextvars.ContextVar[str] = contextvars.ContextVar(
    "current_principal", default="anonymous"
)

# Health and reflection stay open so load balancers and grpcurl need no token.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_PRINCIPAL = re.compile(r"[A-Za-z0-9._-]{1,64}")


class Role(enum.IntEnum):
    READER = 1
    WRITER = 2
    REPLICA = 3


# Which role a token gets when one secret is configured for several.
_PREFERENCE = (Role.WRITER, Role.REPLICA, Role.READER)


@dataclass(frozen=True)
class Token:
    """One accepted bearer token."""

    principal: str
    secret: str = field(repr=False)


def parse_tokens(spec: str, default_principal: str) -> tuple[Token, ...]:
    """Parses a comma-separated list of `TOKEN` or `PRINCIPAL:TOKEN`."""
    tokens = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        principal, sep, secret = item.partition(":")
        if sep and _PRINCIPAL.fullmatch(principal) and secret:
            tokens.append(Token(principal, secret))
        else:
            tokens.append(Token(default_principal, item))
    return tuple(tokens)


@dataclass(frozen=True)
class ServerSecurity:
    """Authentication and transport security of one server."""

    reader_tokens: tuple[Token, ...] = ()
    writer_tokens: tuple[Token, ...] = ()
    replica_tokens: tuple[Token, ...] = ()
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # When set, clients must present a certificate signed by this CA (mTLS).
    tls_client_ca_file: Path | None = None
    # Serve every address even with nothing to authenticate callers by.
    insecure: bool = False

    @property
    def auth_enabled(self) -> bool:
        return bool(self.reader_tokens or self.writer_tokens or self.replica_tokens)

    @property
    def loopback_only(self) -> bool:
        """Protected mode: nothing authenticates callers, so only local ones are served."""
        return not (self.auth_enabled or self.tls_client_ca_file or self.insecure)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        ca = self.tls_client_ca_file.read_bytes() if self.tls_client_ca_file else None
        return grpc.ssl_server_credentials(
            [(self.tls_key_file.read_bytes(), self.tls_cert_file.read_bytes())],
            root_certificates=ca,
            require_client_auth=ca is not None,
        )


class TokenAuth:
    """Checks `authorization: Bearer <token>` against the reader, writer and replica
    roles: `write_methods` need a writer token, `replica_methods` a replica token,
    every other method any token."""

    def __init__(
        self,
        security: ServerSecurity,
        write_methods: Iterable[str],
        replica_methods: Iterable[str] = (),
        *,
        carrier: str = "metadata",
    ) -> None:
        """`carrier` names where the token travels in refusals: gRPC metadata, or the
        HTTP front's header."""
        self._carrier = carrier
        self._tokens = (
            [(t, Role.READER) for t in security.reader_tokens]
            + [(t, Role.WRITER) for t in security.writer_tokens]
            + [(t, Role.REPLICA) for t in security.replica_tokens]
        )
        self._needs = {m: Role.WRITER for m in write_methods} | {
            m: Role.REPLICA for m in replica_methods
        }

    def guard_for(
        self, method: str
    ) -> Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[None]] | None:
        if not self._tokens or method.startswith(OPEN_METHOD_PREFIXES):
            return None
        needed = self._needs.get(method)

        async def guard(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            matches = self._matches(context.invocation_metadata() or ())
            if needed is not None and needed not in matches:
                raise PermissionDenied(f"{method} needs a {needed.name.lower()} token")
            current_principal.set(matches[needed or _best(matches)])

        return guard

    def authenticate(self, metadata: Iterable[Any]) -> tuple[str, Role]:
        """The principal and role an `authorization` entry grants; raises Unauthenticated.

        Public for fronts other than gRPC (the HTTP front), which pass their header here.
        """
        matches = self._matches(metadata)
        role = _best(matches)
        return matches[role], role

    def _matches(self, metadata: Iterable[Any]) -> dict[Role, str]:
        """The principal per role the presented token has; raises Unauthenticated."""
        header = next((value for key, value in metadata if key == "authorization"), None)
        if header is None:
            raise Unauthenticated(f"missing 'authorization: Bearer <token>' {self._carrier}")
        scheme, _, presented = str(header).partition(" ")
        if scheme.lower() != "bearer" or not presented:
            raise Unauthenticated(f"authorization {self._carrier} must be 'Bearer <token>'")
        matches: dict[Role, str] = {}
        # Compare against every token, so timing does not reveal which one matched.
        for token, role in self._tokens:
            if hmac.compare_digest(token.secret.encode(), presented.encode()):
                matches.setdefault(role, token.principal)
        if not matches:
            raise Unauthenticated("invalid bearer token")
        return matches


def _best(matches: dict[Role, str]) -> Role:
    return next(role for role in _PREFERENCE if role in matches)


@dataclass(frozen=True)
class ClientSecurity:
    """How a client authenticates to a server."""

    token: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    def channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not (self.tls or self.tls_ca_file or self.tls_cert_file):
            return None
        return grpc.ssl_channel_credentials(
            root_certificates=self.tls_ca_file.read_bytes() if self.tls_ca_file else None,
            private_key=self.tls_key_file.read_bytes() if self.tls_key_file else None,
            certificate_chain=self.tls_cert_file.read_bytes() if self.tls_cert_file else None,
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()


def secure_channel(
    address: str, security: ClientSecurity, options: Iterable[tuple[str, Any]] = ()
) -> grpc.aio.Channel:
    """Opens an aio channel that adds the bearer token to every call."""
    interceptors: list[Any] = (
        [kind(security.metadata()) for kind in _BEARER_KINDS] if security.token else []
    )
    credentials = security.channel_credentials()
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=list(options), interceptors=interceptors)
    return grpc.aio.secure_channel(
        address, credentials, options=list(options), interceptors=interceptors
    )


class _BearerInterceptor:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def _with_token(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# grpc.aio files each interceptor under the FIRST call kind it is an instance of, so
# one class deriving from all four would only ever see unary-unary calls: one per kind.
class _BearerUnaryUnary(_BearerInterceptor, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _BearerUnaryStream(_BearerInterceptor, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._with_token(details), request)


class _BearerStreamUnary(_BearerInterceptor, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._with_token(details), requests)


class _BearerStreamStream(_BearerInterceptor, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._with_token(details), requests)


_BEARER_KINDS = (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)


def _read_secret(value: str | None, file: str | None, what: str) -> str:
    if file:
        try:
            return Path(file).read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {what} file {file}: {exc.strerror}") from exc
    return value or ""


def add_server_security_flags(
    parser: argparse.ArgumentParser,
    env_prefix: str,
    environ: Mapping[str, str],
    roles: Iterable[str] = ("reader", "writer"),
) -> None:
    """Adds token flags for `roles`, TLS flags and `--insecure`; each falls back to
    `<PREFIX>_<FLAG>` in `environ`."""
    group = parser.add_argument_group("security")
    env = EnvFlags(environ, env_prefix)
    for role in roles:
        env.add(
            group,
            f"{role}-token",
            f"{role} bearer tokens, comma-separated TOKEN or PRINCIPAL:TOKEN",
        )
        env.add(group, f"{role}-token-file", f"file holding the {role} tokens")
    env.add(group, "tls-cert", "server certificate chain (PEM)", type=Path)
    env.add(group, "tls-key", "server private key (PEM)", type=Path)
    env.add(
        group, "tls-client-ca", "CA that client certificates must chain to; enables mTLS", type=Path
    )
    group.add_argument(
        "--insecure",
        action="store_true",
        default=env.switch("insecure"),
        help="with no token and no --tls-client-ca, serve every address without "
        "authentication; without this flag such a server serves loopback clients only "
        "(protected mode), since anyone who reaches it could call everything "
        f"(env {env.env_name('insecure')})",
    )


def server_security_from_args(args: argparse.Namespace) -> ServerSecurity:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InvalidArgument("--tls-cert and --tls-key must be given together")
    if args.tls_client_ca and not args.tls_cert:
        raise InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key")
    return ServerSecurity(
        reader_tokens=parse_tokens(
            _read_secret(args.reader_token, args.reader_token_file, "reader token"), "reader"
        ),
        writer_tokens=parse_tokens(
            _read_secret(args.writer_token, args.writer_token_file, "writer token"), "writer"
        ),
        replica_tokens=parse_tokens(
            _read_secret(
                getattr(args, "replica_token", None),
                getattr(args, "replica_token_file", None),
                "replica token",
            ),
            "replica",
        ),
        tls_cert_file=args.tls_cert,
        tls_key_file=args.tls_key,
        tls_client_ca_file=args.tls_client_ca,
        insecure=bool(args.insecure),
    )


def add_client_security_flags(
    parser: argparse.ArgumentParser,
    env_prefix: str,
    environ: Mapping[str, str],
    flag_prefix: str = "",
) -> None:
    """Adds `--[PREFIX-]token`, `--[PREFIX-]tls` and CA/cert/key flags for one peer."""
    flag = f"{flag_prefix}-" if flag_prefix else ""
    group = parser.add_argument_group(f"{flag_prefix or 'client'} security")
    env = EnvFlags(environ, env_prefix)
    env.add(group, f"{flag}token", "bearer token")
    env.add(group, f"{flag}token-file", "file holding the bearer token")
    group.add_argument(
        f"--{flag}tls",
        action="store_true",
        default=env.switch(f"{flag}tls"),
        help=f"use TLS with the system roots (env {env.env_name(f'{flag}tls')})",
    )
    env.add(group, f"{flag}tls-ca", "CA bundle to verify the server (PEM); implies TLS", type=Path)
    env.add(group, f"{flag}tls-cert", "client certificate for mTLS (PEM)", type=Path)
    env.add(group, f"{flag}tls-key", "client private key for mTLS (PEM)", type=Path)


def client_security_from_args(args: argparse.Namespace, flag_prefix: str = "") -> ClientSecurity:
    pre = flag_prefix.replace("-", "_") + "_" if flag_prefix else ""

    def get(name: str) -> Any:
        return getattr(args, pre + name)

    if bool(get("tls_cert")) != bool(get("tls_key")):
        raise InvalidArgument("a client TLS certificate and key must be given together")
    token = _read_secret(get("token"), get("token_file"), "token") or None
    return ClientSecurity(
        token=token,
        tls=bool(get("tls")),
        tls_ca_file=get("tls_ca"),
        tls_cert_file=get("tls_cert"),
        tls_key_file=get("tls_key"),
    )
