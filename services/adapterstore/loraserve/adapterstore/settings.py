"""The adapter store's one settings object, parsed once from flags with env fallbacks.

Every flag falls back to `ADAPTERSTORE_<FLAG>` in the environment (dashes as
underscores), so a container can be configured without a command line. Secrets
can come from files (`--access-key-id-file`, `--secret-access-key-file`, token
files) and never appear in a repr.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loraserve.adapterstore.blobs import (
    DEFAULT_PART_SIZE,
    DEFAULT_PARTS_IN_FLIGHT,
    MAX_URL_TTL_S,
    MIN_PART_SIZE,
    S3Location,
)
from loraserve.adapterstore.changelog import LogSettings
from loraserve.adapterstore.compat import OLDEST_FORMAT, READ_FORMAT, check_write_format
from loraserve.adapterstore.compat.gate import DEFAULT_PRESENCE_INTERVAL_S, FormatSettings
from loraserve.adapterstore.files import Limits
from loraserve.adapterstore.files.download_urls import DEFAULT_URL_MIN_RATE, URL_TTL_MARGIN_S
from loraserve.adapterstore.replicas.model import DEFAULT_STATUS_TTL_S
from loraserve.adapterstore.store import StoreSettings
from loraserve.common.config.flags import (
    EnvFlags,
    non_negative_float,
    non_negative_int,
    parse_args,
    positive_float,
    positive_int,
)
from loraserve.common.config.sizes import parse_size
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.limits import (
    ServerLimits,
    add_server_limit_flags,
    server_limits_from_args,
)
from loraserve.common.rpc.metrics_http import add_metrics_flags, metrics_address
from loraserve.common.rpc.security import (
    ServerSecurity,
    add_server_security_flags,
    server_security_from_args,
)
from loraserve.common.tracing import TracingSettings, add_tracing_flags, tracing_from_args
from loraserve.common.trust.policy import add_trust_flags, trust_settings_from_args

ENV_PREFIX = "ADAPTERSTORE"
DEFAULT_URL_TTL_S = 300


@dataclass(frozen=True)
class AdapterStoreSettings:
    """Everything `adapterstore serve` runs with."""

    listen: str
    s3: S3Location
    part_size: int
    parts_in_flight: int
    store: StoreSettings
    log: LogSettings
    security: ServerSecurity
    status_ttl_s: float = DEFAULT_STATUS_TTL_S
    # The most seconds a presigned download URL stays valid; 0: hand out none (replicas
    # stream). Each URL gets less when its revision reads faster (`url_ttl_s`).
    download_url_ttl_s: int = DEFAULT_URL_TTL_S
    # Bytes per second a replica is expected to read at least: sets URLs' lifetime.
    download_url_min_rate: int = DEFAULT_URL_MIN_RATE
    # The object storage endpoint as replicas reach it; None: --s3-endpoint.
    download_url_endpoint: str | None = None
    # HOST:PORT of the metrics endpoint; None: off.
    metrics_listen: str | None = None
    # Seconds before a gRPC connection is asked to close; 0: never.
    max_connection_age_s: float = 300.0
    # What one gRPC peer may hold: streams, connections, calls, time, unread output.
    limits: ServerLimits = field(default_factory=ServerLimits)
    shutdown_grace_seconds: float = 30.0
    log_level: str = "INFO"
    # Where this store's spans go, and how many; off unless an endpoint is configured.
    tracing: TracingSettings = field(default_factory=TracingSettings)
    # Which storage formats it may write, and how often it announces itself.
    formats: FormatSettings = field(default_factory=FormatSettings)


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The `adapterstore` command line; defaults come from `environ`."""
    parser = argparse.ArgumentParser(prog="adapterstore", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the adapter store server")
    flags = EnvFlags(environ, ENV_PREFIX)
    flag = functools.partial(flags.add, serve)
    flag("listen", "gRPC address HOST:PORT", "0.0.0.0:50051")
    _add_storage_flags(flag)
    _add_limit_flags(flag)
    _add_log_flags(flag)
    add_metrics_flags(serve, flags)
    flag(
        "max-connection-age",
        "ask each gRPC connection to close (GOAWAY) once this many seconds old: its calls "
        "finish, clients reconnect and resolve dns:/// targets again, so new store replicas "
        "get calls (0: never)",
        "300",
        type=non_negative_float,
    )
    flag("shutdown-grace", "seconds in-flight calls get to finish on SIGTERM", "30", type=float)
    flag("log-level", "logging level", "INFO")
    add_trust_flags(flag)
    add_server_security_flags(
        serve, ENV_PREFIX, environ, roles=("reader", "writer", "admin", "replica")
    )
    add_server_limit_flags(serve, flags)
    add_tracing_flags(serve, ENV_PREFIX, environ)
    return parser


def _add_limit_flags(flag: Callable[..., None]) -> None:
    """Sizes a push may have and the clocks of watches, statuses and uploads."""
    flag("max-file-size", "largest file accepted in a push", "4GiB", type=parse_size)
    flag("max-adapter-size", "largest total of one push's files", "8GiB", type=parse_size)
    flag(
        "heartbeat-interval",
        "seconds of quiet before a watch heartbeat",
        "10",
        type=positive_float,
    )
    flag(
        "poll-interval",
        "seconds between looks for other replicas' commits",
        "0.25",
        type=positive_float,
    )
    flag(
        "max-staleness",
        "seconds without reading the log's head from object storage before this replica "
        "reports NOT_SERVING and its watch heartbeats send clients to another replica",
        "30",
        type=positive_float,
    )
    flag(
        "status-ttl",
        "seconds after an inference replica's last sign of life (or last report) before "
        "its statuses stop being shown and are deleted",
        f"{DEFAULT_STATUS_TTL_S:g}",
        type=positive_float,
    )
    flag(
        "rollout-check-interval",
        "seconds between this replica's checks of active rollouts: it reads the replicas' "
        "counters and NACKs and aborts a rollout whose guards condemn it",
        "5",
        type=positive_float,
    )
    flag(
        "stale-upload-age",
        "seconds after which an incomplete multipart upload or tmp/ object that an "
        "interrupted push left is deleted at start-up (0: never)",
        "86400",
        type=non_negative_float,
    )


def _add_log_flags(flag: Callable[..., None]) -> None:
    """How often the change log is snapshotted and how much of it is kept."""
    flag("snapshot-every", "commits between state snapshots", "100", type=positive_int)
    flag(
        "storage-format",
        f"the newest storage format this store writes ({OLDEST_FORMAT}..{READ_FORMAT}); it "
        "writes an older one while a store that cannot read it is live on the bucket, and "
        f"{OLDEST_FORMAT} lets this release be rolled back to 0.1.0 (docs/compatibility.md)",
        str(READ_FORMAT),
        type=_storage_format,
    )
    flag(
        "presence-interval",
        "seconds between this store's announcements of itself on the bucket (its release "
        "and the formats it reads), from which every store decides what it may write",
        f"{DEFAULT_PRESENCE_INTERVAL_S:g}",
        type=positive_float,
    )
    flag(
        "log-retention",
        "newest log entries always kept for watchers to resume from; older ones are deleted "
        "once a snapshot covers them (0: keep all)",
        "10000",
        type=non_negative_int,
    )


def _storage_format(text: str) -> int:
    try:
        return check_write_format(int(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_storage_flags(flag: Callable[..., None]) -> None:
    s3 = "object storage"
    flag("s3-endpoint", f"{s3}: endpoint URL of an S3-compatible service; unset: AWS")
    flag("bucket", f"{s3}: bucket name (required)")
    flag("prefix", f"{s3}: key prefix inside the bucket", "")
    flag("region", f"{s3}: region")
    flag("access-key-id", f"{s3}: access key id; unset: boto3's default credential chain")
    flag("access-key-id-file", f"{s3}: file holding the access key id")
    flag("secret-access-key", f"{s3}: secret access key")
    flag("secret-access-key-file", f"{s3}: file holding the secret access key")
    flag("part-size", f"{s3}: multipart upload part size", "8MiB", type=parse_size)
    flag(
        "download-url-ttl",
        f"{s3}: the most seconds a presigned download URL handed to replicas stays valid "
        f"(at most {MAX_URL_TTL_S}); 0: hand out none, replicas read through the store",
        str(DEFAULT_URL_TTL_S),
        type=non_negative_int,
    )
    flag(
        "download-url-min-rate",
        f"{s3}: the slowest read, in bytes per second, a replica is expected to manage: "
        f"a URL lives {URL_TTL_MARGIN_S} s plus its revision's size at this rate, capped "
        "by --download-url-ttl",
        "2MiB",
        type=parse_size,
    )
    flag(
        "download-url-endpoint",
        f"{s3}: endpoint URL replicas reach object storage at, for the URLs they are "
        "handed; unset: --s3-endpoint",
    )
    flag(
        "parts-in-flight",
        f"{s3}: parts of one upload sent at once (memory per push: about this + 1 parts)",
        str(DEFAULT_PARTS_IN_FLIGHT),
        type=positive_int,
    )


def _secret(value: str | None, file: str | None, what: str) -> str | None:
    if file:
        try:
            return Path(file).read_text().strip()
        except OSError as e:
            raise InvalidArgument(f"cannot read the {what} file {file}: {e.strerror}") from e
    return value or None


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> AdapterStoreSettings:
    """Parses `adapterstore serve ...`; raises InvalidArgument for inconsistent flags."""
    args = parse_args(build_parser(environ), argv)
    if not args.bucket:
        raise InvalidArgument(f"--bucket (or {ENV_PREFIX}_BUCKET) is required")
    access_key_id = _secret(args.access_key_id, args.access_key_id_file, "access key id")
    secret_access_key = _secret(
        args.secret_access_key, args.secret_access_key_file, "secret access key"
    )
    if bool(access_key_id) != bool(secret_access_key):
        raise InvalidArgument("the access key id and secret access key must be given together")
    if args.part_size < MIN_PART_SIZE:
        raise InvalidArgument(f"--part-size must be at least {MIN_PART_SIZE} bytes (5MiB)")
    if args.download_url_ttl > MAX_URL_TTL_S:
        raise InvalidArgument(f"--download-url-ttl must be at most {MAX_URL_TTL_S} seconds")
    if args.download_url_min_rate < 1:
        raise InvalidArgument("--download-url-min-rate must be at least 1 byte per second")
    if args.max_file_size > args.max_adapter_size:
        raise InvalidArgument("--max-file-size must not exceed --max-adapter-size")
    security = server_security_from_args(args)
    return AdapterStoreSettings(
        listen=args.listen,
        s3=S3Location(
            bucket=args.bucket,
            prefix=args.prefix,
            endpoint_url=args.s3_endpoint or None,
            region=args.region or None,
            access_key_id=access_key_id,
            secret_access_key=secret_access_key,
        ),
        part_size=int(args.part_size or DEFAULT_PART_SIZE),
        parts_in_flight=int(args.parts_in_flight),
        store=StoreSettings(
            limits=Limits(int(args.max_file_size), int(args.max_adapter_size)),
            heartbeat_interval=float(args.heartbeat_interval),
            max_staleness_s=float(args.max_staleness),
            stale_upload_age_s=float(args.stale_upload_age),
            rollout_check_interval_s=float(args.rollout_check_interval),
            trust=trust_settings_from_args(args),
        ),
        log=LogSettings(
            poll_interval=float(args.poll_interval),
            snapshot_every=int(args.snapshot_every),
            log_retention=int(args.log_retention),
        ),
        security=security,
        status_ttl_s=float(args.status_ttl),
        download_url_ttl_s=int(args.download_url_ttl),
        download_url_min_rate=int(args.download_url_min_rate),
        download_url_endpoint=args.download_url_endpoint or None,
        metrics_listen=metrics_address(args, args.listen, loopback_only=security.loopback_only),
        max_connection_age_s=float(args.max_connection_age),
        limits=server_limits_from_args(args),
        shutdown_grace_seconds=float(args.shutdown_grace),
        log_level=str(args.log_level).upper(),
        tracing=tracing_from_args(args, environ),
        formats=FormatSettings(int(args.storage_format), float(args.presence_interval)),
    )
