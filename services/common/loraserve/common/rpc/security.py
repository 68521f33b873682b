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
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from loraserve.common.config.flags import EnvFlags
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.tlsfiles import CertificateFiles
from loraserve.common.tracing import tracing_interceptors

# Set for the duration of an authenticated call; read by servicers for audit fields.
current_principal: contextvars.ContextVar[str] = contextvars.ContextVar(
    "current_principal", default="anonymous"
)

# Health and reflection stay open so load balancers and grpcurl need no token.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
_PRINCIPAL = re.compile(r"[A-Za-z0-9._-]{1,64}")
# What names an inference replica, in its reports and its credential.
REPLICA_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
# Where a replica's client certificate names it (a URI SAN), SPIFFE style.
DEFAULT_REPLICA_URI_PREFIX = "spiffe://loraserve/replica/"


class Role(enum.IntEnum):
    READER = 1
    WRITER = 2
    REPLICA = 3
    ADMIN = 4
    # Inference only: may pin a revision (`NAME@REV`) as the pin policy allows.
    PINNER = 5


# The role the caller's credential proved, for the duration of an authenticated call;
# None where the server authenticates nobody (loopback-only or --insecure).
current_role: contextvars.ContextVar[Role | None] = contextvars.ContextVar(
    "current_role", default=None
)


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
    admin_tokens: tuple[Token, ...] = ()
    pinner_tokens: tuple[Token, ...] = ()
    # A client certificate with a URI SAN under this prefix proves the replica role for
    # the replica the rest of the URI names.
    replica_uri_prefix: str = DEFAULT_REPLICA_URI_PREFIX
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # When set, clients must present a certificate signed by this CA (mTLS).
    tls_client_ca_file: Path | None = None
    # Serve every address even with nothing to authenticate callers by.
    insecure: bool = False

    def __post_init__(self) -> None:
        # A secret configured twice would prove whichever role or principal the front
        # that checks it prefers.
        seen: dict[str, str] = {}
        for role, tokens in self.tokens.items():
            for token in tokens:
                here = f"{role.name.lower()} {token.principal!r}"
                if token.secret in seen:
                    raise InvalidArgument(
                        f"one token is configured twice ({seen[token.secret]} and {here}): "
                        "give each role and principal its own"
                    )
                seen[token.secret] = here

    @property
    def tokens(self) -> dict[Role, tuple[Token, ...]]:
        """Every configured token, by the role it grants."""
        return {
            Role.READER: self.reader_tokens,
            Role.WRITER: self.writer_tokens,
            Role.ADMIN: self.admin_tokens,
            Role.REPLICA: self.replica_tokens,
            Role.PINNER: self.pinner_tokens,
        }

    @property
    def auth_enabled(self) -> bool:
        return any(self.tokens.values())

    @property
    def loopback_only(self) -> bool:
        """Protected mode: nothing authenticates callers, so only local ones are served."""
        return not (self.auth_enabled or self.tls_client_ca_file or self.insecure)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """TLS credentials that follow their files: each new connection's handshake
        uses what the files hold then, so a certificate renewed in place (cert-manager,
        a kubelet secret volume) is served without a restart."""
        if self.tls_cert_file is None or self.tls_key_file is None:
            return None
        files = CertificateFiles(self.tls_cert_file, self.tls_key_file, self.tls_client_ca_file)
        return grpc.dynamic_ssl_server_credentials(
            files.load(),
            # grpc's stub omits that the fetcher may return None (keep the current one).
            files.changed,  # type: ignore[arg-type]
            require_client_authentication=files.ca is not None,
        )


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
    """Opens an aio channel that adds the bearer token and, once the process records
    traces, the caller's trace context to every call."""
    interceptors: list[Any] = tracing_interceptors()
    if security.token:
        interceptors.extend(kind(security.metadata()) for kind in _BEARER_KINDS)
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


# What each role's tokens let their holders do, for the flags' help.
_ROLE_HELP = {
    "reader": "read adapters and, on inference, generate",
    "writer": "also push",
    "admin": "also delete, set-current, rollback, quotas, rollouts and yanks",
    "replica": "inference replicas: also report; each PRINCIPAL:TOKEN names its replica",
    "pinner": "also pin revisions (NAME@REV) as --pin-policy allows",
}


def add_server_security_flags(
    parser: argparse.ArgumentParser,
    env_prefix: str,
    environ: Mapping[str, str],
    roles: Iterable[str] = ("reader", "writer"),
) -> None:
    """Adds token flags for `roles`, TLS flags and `--insecure`; each falls back to
    `<PREFIX>_<FLAG>` in `environ`. With the replica role, `--replica-uri-prefix` too."""
    group = parser.add_argument_group("security")
    env = EnvFlags(environ, env_prefix)
    for role in roles:
        env.add(
            group,
            f"{role}-token",
            f"{role} bearer tokens ({_ROLE_HELP[role]}), comma-separated TOKEN or "
            "PRINCIPAL:TOKEN; a flag's value shows in `ps`: prefer the file or the environment",
        )
        env.add(group, f"{role}-token-file", f"file holding the {role} tokens")
    if "replica" in roles:
        env.add(
            group,
            "replica-uri-prefix",
            "with --tls-client-ca, a client certificate whose URI SAN starts with this "
            "proves the replica role for the replica the rest names",
            default=DEFAULT_REPLICA_URI_PREFIX,
        )
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


def _role_tokens(args: argparse.Namespace, role: str) -> tuple[Token, ...]:
    secret = _read_secret(
        getattr(args, f"{role}_token", None), getattr(args, f"{role}_token_file", None), role
    )
    if role != "replica":
        return parse_tokens(secret, role)
    # A replica's reports are accepted for the replica its token names only, so a token
    # that names none could report for no one: refused at start, not at each report.
    tokens = parse_tokens(secret, "")
    for token in tokens:
        if ":" in token.secret:
            # `zone:a:SECRET` would name replica `zone`, not `zone:a`.
            raise InvalidArgument(
                f"replica token of {token.principal!r}: a replica token's secret may not "
                "hold ':' (a replica id with ':' cannot be named in a token)"
            )
        if not REPLICA_ID_PATTERN.fullmatch(token.principal):
            raise InvalidArgument(
                "each replica token must be PRINCIPAL:TOKEN, PRINCIPAL being that replica's "
                "--replica-id: a replica may only report for itself"
            )
    return tokens


def server_security_from_args(args: argparse.Namespace) -> ServerSecurity:
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InvalidArgument("--tls-cert and --tls-key must be given together")
    if args.tls_client_ca and not args.tls_cert:
        raise InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key")
    prefix = getattr(args, "replica_uri_prefix", None) or DEFAULT_REPLICA_URI_PREFIX
    if "://" not in prefix or not prefix.endswith("/"):
        # Without the slash, `spiffe://x/replica` would also claim `spiffe://x/replicaset-7`.
        raise InvalidArgument(
            f"--replica-uri-prefix {prefix!r} must be a URI ending in '/', as "
            f"{DEFAULT_REPLICA_URI_PREFIX!r}"
        )
    return ServerSecurity(
        reader_tokens=_role_tokens(args, "reader"),
        writer_tokens=_role_tokens(args, "writer"),
        replica_tokens=_role_tokens(args, "replica"),
        admin_tokens=_role_tokens(args, "admin"),
        pinner_tokens=_role_tokens(args, "pinner"),
        replica_uri_prefix=prefix,
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
