"""What one peer may hold of a gRPC server: streams, connections, calls, time, and
output it does not read. grpc core's defaults bound neither streams per connection nor
calls, give a handshake two minutes and a connection age no grace; every limit here is
explicit, a flag with an environment fallback, and the same on both services.

Request bodies: a call's message is read only after its credential is checked
(`loraserve.common.rpc.grpcutil.ErrorMappingInterceptor` refuses a call with no valid
token when its HEADERS arrive), so a peer without a token makes the server hold none of
its bytes. An authenticated peer can make it hold at most one message of
`MESSAGE_LIMIT` per stream: `max_streams_per_connection` of them per connection, and
`max_calls` in all where that cap is set."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from loraserve.common.config.flags import (
    EnvFlags,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)

# Client pings grpc core tolerates: one per 5 minutes while no call is running, two
# strikes, then GOAWAY too_many_pings. Kept at core's values and stated, so a change
# in grpcio cannot loosen them.
_PING_INTERVAL_WITHOUT_CALLS_MS = 300_000
_PING_STRIKES = 2
# grpc core's set of compression algorithms a server accepts, as a bitset: identity only.
_IDENTITY_ONLY = 1


@dataclass(frozen=True)
class ServerLimits:
    """The bounds a gRPC server puts on its peers."""

    # Concurrent streams on one HTTP/2 connection, advertised in SETTINGS; more are
    # refused (REFUSED_STREAM). Set above any one client's concurrency, not at HTTP/2's
    # customary 100: grpc core's clients do not wait for a slot but fail the calls past
    # it UNAVAILABLE (29 of 160 calls on one channel to a limit of 100, grpcio 1.85),
    # and a gateway multiplexes many users' streams on a connection.
    max_streams_per_connection: int = 1000
    # Connections the server holds at once, every peer together; more are closed. A
    # safety net for memory and descriptors (an idle connection costs about 13 KiB), set
    # high: grpc core has no per-peer cap, so a low global one would let one peer that
    # opens many connections lock every other client out until its handshakes time out.
    max_connections: int = 10000
    # Calls running at once, every connection together; more end RESOURCE_EXHAUSTED
    # when their HEADERS arrive, none of their bytes read. Off (0) by default: grpc.aio
    # counts every call, health and reflection too, which need no token, so a cap lets
    # a caller without one hold every place (health's Watch never ends) and fail the
    # probes. Worth setting where every caller is trusted.
    max_calls: int = 0
    # Seconds a new connection has for its TLS handshake and HTTP/2 preface.
    handshake_timeout_s: float = 10.0
    # Seconds a connection with no call may stay open (0: forever).
    idle_timeout_s: float = 600.0
    # Seconds a connection past its maximum age keeps for the calls on it, then they
    # end UNAVAILABLE (watches resume on a new connection): the longest a generation
    # running at that moment may still take.
    connection_age_grace_s: float = 600.0
    # Seconds a streamed message may wait for the client to read (flow control): a
    # client that reads nothing for this long has its call's handler ended
    # (RESOURCE_EXHAUSTED), and what it held (an engine request, an admission slot, an
    # adapter lease) released. The HTTP/2 stream itself stays open until its connection
    # closes (at the latest its maximum age and grace): grpc.aio cannot reset a stream,
    # and the status waits behind the message the client does not read.
    stalled_write_s: float = 60.0
    # Whether a request message may arrive compressed. Off by default: grpc core
    # inflates a gzip message whole (up to the message limit) before anything can refuse
    # it, 40 ms of CPU per 4 MiB bomb here, so 50 bombs a second with no token held
    # normal calls' p99 from 55 ms to 2.2 s on a store (`make abuse`); refused, a
    # compressed message ends UNIMPLEMENTED before it is read. The project's clients
    # send nothing compressed: prompts are small and adapter weights do not compress.
    compressed_requests: bool = False

    def grpc_options(self) -> list[tuple[str, Any]]:
        """The grpc core channel arguments for these limits."""
        options: list[tuple[str, Any]] = [
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            ("grpc.server_handshake_timeout_ms", _ms(self.handshake_timeout_s)),
            ("grpc.max_connection_age_grace_ms", _ms(self.connection_age_grace_s)),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.min_ping_interval_without_data_ms", _PING_INTERVAL_WITHOUT_CALLS_MS),
            ("grpc.http2.max_ping_strikes", _PING_STRIKES),
        ]
        if self.idle_timeout_s:
            options.append(("grpc.max_connection_idle_ms", _ms(self.idle_timeout_s)))
        if not self.compressed_requests:
            options.append(("grpc.compression_enabled_algorithms_bitset", _IDENTITY_ONLY))
        return options


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def add_server_limit_flags(parser: argparse.ArgumentParser, flags: EnvFlags) -> None:
    """A flag for each field of `ServerLimits`, read back by `server_limits_from_args`."""
    group = parser.add_argument_group("limits on gRPC peers")
    default = ServerLimits()
    flags.add(
        group,
        "max-streams-per-connection",
        "concurrent calls on one gRPC connection (advertised to the client; more are "
        "refused and retried elsewhere)",
        str(default.max_streams_per_connection),
        type=positive_int,
    )
    flags.add(
        group,
        "max-connections",
        "gRPC connections held at once, all clients together",
        str(default.max_connections),
        type=positive_int,
    )
    flags.add(
        group,
        "max-calls",
        "gRPC calls running at once, health and reflection included; more end "
        "RESOURCE_EXHAUSTED before their request is read (0: no cap, since callers without "
        "a token could fill it with health watches)",
        str(default.max_calls),
        type=non_negative_int,
    )
    flags.add(
        group,
        "handshake-timeout",
        "seconds a new connection has for its TLS handshake and HTTP/2 preface",
        f"{default.handshake_timeout_s:g}",
        type=positive_float,
    )
    flags.add(
        group,
        "idle-timeout",
        "seconds a connection with no call stays open (0: forever)",
        f"{default.idle_timeout_s:g}",
        type=non_negative_float,
    )
    flags.add(
        group,
        "connection-age-grace",
        "seconds the calls on a connection past --max-connection-age keep to finish",
        f"{default.connection_age_grace_s:g}",
        type=non_negative_float,
    )
    flags.add(
        group,
        "stalled-write-timeout",
        "seconds a streamed message waits for a client that reads nothing before its "
        "call ends RESOURCE_EXHAUSTED and what it held is released",
        f"{default.stalled_write_s:g}",
        type=positive_float,
    )
    _add_compression_flag(group, flags)


def _add_compression_flag(group: argparse._ArgumentGroup, flags: EnvFlags) -> None:
    group.add_argument(
        "--accept-compressed-requests",
        action="store_true",
        default=flags.switch("accept-compressed-requests"),
        help="accept gzip- and deflate-compressed request messages (off: each is refused "
        "UNIMPLEMENTED before it is inflated) "
        f"(env {flags.env_name('accept-compressed-requests')})",
    )


def server_limits_from_args(args: argparse.Namespace) -> ServerLimits:
    return ServerLimits(
        max_streams_per_connection=int(args.max_streams_per_connection),
        max_connections=int(args.max_connections),
        max_calls=int(args.max_calls),
        handshake_timeout_s=float(args.handshake_timeout),
        idle_timeout_s=float(args.idle_timeout),
        connection_age_grace_s=float(args.connection_age_grace),
        stalled_write_s=float(args.stalled_write_timeout),
        compressed_requests=bool(args.accept_compressed_requests),
    )
