"""Adapter affinity across inference replicas, on gRPC's own `ring_hash` policy.

Given several replicas (a comma list of IP addresses, or a `dns:///` name that resolves
to several), the client hashes a request header carrying the adapter NAME (never
NAME@REV, so every revision of an adapter lands on the replica that holds it warm; the
base model hashes to one fixed key) onto a ring of the replicas (gRFC A76). A replica
that goes away drops out of the ring and its adapters move to the next replica on it.
Calls without the header (ListAdapters, GetServerInfo) get a random hash: any replica.

grpcio only honours `requestHashHeader` with `GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY`
true in the environment; without it every call fails INTERNAL "hash attribute not
present". grpcio 1.85 reads the variable each time a channel takes its service config,
so setting it in `os.environ` before opening the channel works in-process; a value the
user set to something else is theirs, and refused by name.

Envoy does the same for clients in other languages: `deploy/envoy/envoy.yaml` hashes
the same header.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from loraserve.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    LoraserveError,
    error_from_rpc,
)
from loraserve.common.revisions.names import parse_adapter_ref, shown

log = logging.getLogger(__name__)

# The request header every replica choice hashes, here and in the Envoy config.
ADAPTER_HASH_HEADER = "x-loraserve-adapter"
# The header value of base-model requests: not a valid adapter name, so no adapter shares it.
BASE_MODEL_HASH_KEY = "_base"
RING_HASH_ENV = "GRPC_EXPERIMENTAL_RING_HASH_SET_REQUEST_HASH_KEY"
# What grpc's own boolean parsing takes as true.
_TRUE_VALUES = frozenset({"true", "yes", "1"})
_FLEET_SCHEMES = ("dns:", "ipv4:", "ipv6:")
# grpcio's message when the header cannot be hashed (the variable is off).
HASH_ATTRIBUTE_MISSING = "hash attribute not present"
_AUTHORITY_OPTIONS = ("grpc.default_authority", "grpc.ssl_target_name_override")


class RingHashDisabled(FailedPrecondition):
    """Routing by adapter needs gRPC's request-hash header, which the environment turns off."""


@dataclass(frozen=True)
class Target:
    """What a channel dials, and whether it spans several replicas (routed by adapter).

    `authority` is the name TLS checks the replicas' certificates against, for an
    address list: gRPC's default for one would be the whole list. The first address
    stands for all of them (give `grpc.default_authority` or
    `grpc.ssl_target_name_override` to check another name)."""

    target: str
    replicas: bool
    authority: str | None = None


def parse_target(address: str) -> Target:
    """`HOST:PORT` (one server, as before), `IP:PORT,IP:PORT,...` (several replicas, as
    an `ipv4:`/`ipv6:` target), or a `dns:`/`ipv4:`/`ipv6:` target (several replicas)."""
    address = address.strip()
    if address.startswith(_FLEET_SCHEMES):
        first = address.partition(":")[2].split(",")[0]
        authority = first if address.startswith(("ipv4:", "ipv6:")) else None
        return Target(address, replicas=True, authority=authority)
    if "," not in address:
        return Target(address, replicas=False)
    parts = [part.strip() for part in address.split(",")]
    families = {_ip_family(part, address) for part in parts}
    if len(families) > 1:
        raise InvalidArgument(
            f"address list {shown(address)} mixes IPv4 and IPv6 addresses; gRPC dials one family"
        )
    return Target(f"{families.pop()}:{','.join(parts)}", replicas=True, authority=parts[0])


@dataclass(frozen=True)
class Channel:
    """How to open a channel to an address: target, load balancing, channel arguments."""

    target: str
    load_balancing: dict[str, Any] | None
    options: list[tuple[str, Any]]


@dataclass(frozen=True)
class Fleet:
    """Several replicas, each dialled on its own channel: a DNS name (HOST:PORT) resolved
    again and again, or fixed addresses; `options` go to every channel (the TLS name
    among them)."""

    host: str | None
    addresses: tuple[str, ...]
    options: list[tuple[str, Any]]


def fleet_for(address: str, channel_options: Sequence[tuple[str, Any]] = ()) -> Fleet | None:
    """The replicas `address` names, one channel each; None for a single server."""
    target = parse_target(address)
    if not target.replicas:
        return None
    options = list(channel_options)
    scheme, _, rest = target.target.partition(":")
    host: str | None
    authority: str | None
    if scheme == "dns":
        host = rest.rpartition("/")[2]
        authority = target.authority or host
        addresses: tuple[str, ...] = ()
    else:
        host, authority, addresses = None, target.authority, tuple(rest.split(","))
    if authority and not any(key in _AUTHORITY_OPTIONS for key, _ in options):
        options.append(("grpc.default_authority", authority))
    return Fleet(host, addresses, options)


def channel_for(address: str, channel_options: Sequence[tuple[str, Any]] = ()) -> Channel:
    """The channel to `address`: ring_hash on the adapter header across several replicas
    (turning on what grpcio needs for it), a plain one to a single server."""
    target = parse_target(address)
    options = list(channel_options)
    if not target.replicas:
        return Channel(target.target, None, options)
    enable_ring_hash()
    if target.authority and not any(key in _AUTHORITY_OPTIONS for key, _ in options):
        options.append(("grpc.default_authority", target.authority))
    return Channel(target.target, ring_hash_config(), options)


def routed_error(exc: grpc.aio.AioRpcError) -> LoraserveError:
    """The domain error of a failed call; gRPC's own refusal to hash the adapter header
    (a gRPC that reads the variable once, before it was set) named as such."""
    if exc.code() is grpc.StatusCode.INTERNAL and HASH_ATTRIBUTE_MISSING in (exc.details() or ""):
        return RingHashDisabled(ring_hash_disabled_message())
    return error_from_rpc(exc)


def may_go_again(exc: BaseException) -> bool:
    """Whether a call that produced nothing yet may go again (elsewhere): UNAVAILABLE,
    CANCELLED from a server shutting down the calls it had not started (grpc/grpc#41785),
    or a stream that ended with no status at all (grpc core's "Stream removed"): HAProxy
    ends a response whose server died after its headers with an empty DATA frame
    (haproxy/haproxy#736), losing the message sent with them. A status the server sent,
    UNKNOWN included, is final; a caller's own cancel is CancelledError, never this."""
    if not isinstance(exc, grpc.aio.AioRpcError):
        return False
    if exc.code() is grpc.StatusCode.UNKNOWN:
        return (exc.details() or "").startswith(_NO_STATUS)
    return exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


# chttp2's text for a stream closed without trailers (frame_data.cc).
_NO_STATUS = "Stream removed"


def _ip_family(part: str, address: str) -> str:
    host, sep, port = part.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidArgument(f"address {shown(part)} in {shown(address)} has no :PORT")
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        raise InvalidArgument(
            f"address list {shown(address)} names {shown(host)}, not an IP address: a list "
            "takes IP addresses; for a name that resolves to the replicas use dns:///NAME:PORT"
        ) from None
    if ip.version == 6 and not host.startswith("["):
        raise InvalidArgument(f"IPv6 address {shown(part)} needs brackets: [ADDRESS]:PORT")
    return f"ipv{ip.version}"


def affinity_key(adapter: str) -> str:
    """The header value for a request's adapter reference: its name, or the base-model key.
    A reference that does not parse is the server's to refuse (wherever it lands); it
    hashes as the base model, since it may hold what a header cannot."""
    try:
        ref = parse_adapter_ref(adapter)
    except InvalidArgument:
        return BASE_MODEL_HASH_KEY
    return ref.name or BASE_MODEL_HASH_KEY


def enable_ring_hash(environ: MutableMapping[str, str] = os.environ) -> None:
    """Turns on gRPC's request-hash header where the user left the variable unset;
    raises `RingHashDisabled` where they set it to something else."""
    value = environ.get(RING_HASH_ENV, "")
    if not value:
        environ[RING_HASH_ENV] = "true"
        log.info("routing.ring_hash_enabled variable=%s", RING_HASH_ENV)
        return
    if value.strip().lower() not in _TRUE_VALUES:
        raise RingHashDisabled(ring_hash_disabled_message(value))


def ring_hash_disabled_message(value: str | None = None) -> str:
    setting = f"is set to {value!r}" if value is not None else "is not true in this process"
    return (
        f"routing by adapter across several inference replicas needs {RING_HASH_ENV}=true, "
        f"but it {setting}: unset it or set it to true, or connect to one address"
    )


def ring_hash_config() -> dict[str, Any]:
    """The loadBalancingConfig entry hashing the adapter header."""
    return {"ring_hash_experimental": {"requestHashHeader": ADAPTER_HASH_HEADER}}
