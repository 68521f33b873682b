"""adapterctl's settings: where the servers are, how to authenticate, how long to wait.

Built once from flags with `ADAPTERCTL_*` / `ADAPTERSTORE_ADDR` / `INFERENCE_ADDR`
environment fallbacks, then passed to every command.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from loraserve.adapterctl.failures import UsageError
from loraserve.common.config.flags import positive_float
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.security import (
    ClientSecurity,
    add_client_security_flags,
    client_security_from_args,
)
from loraserve.common.tracing import otlp_endpoint

DEFAULT_STORE_ADDRESS = "127.0.0.1:50051"
DEFAULT_INFERENCE_ADDRESS = "127.0.0.1:50052"
# Unary calls answer in milliseconds; streams (push, watch, generate) run as long as
# they need unless --timeout bounds them.
DEFAULT_UNARY_TIMEOUT_S = 30.0
ENV_PREFIX = "ADAPTERCTL"
# Where spans go unless --otlp-traces-endpoint says, first set first (OpenTelemetry's own).
_ENDPOINT_ENV = (
    f"{ENV_PREFIX}_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


@dataclass(frozen=True)
class CtlSettings:
    store_address: str
    inference_address: str
    store_security: ClientSecurity
    inference_security: ClientSecurity
    timeout_s: float | None  # as given; None means the per-call default
    json: bool

    @property
    def unary_timeout_s(self) -> float:
        return self.timeout_s if self.timeout_s is not None else DEFAULT_UNARY_TIMEOUT_S

    @property
    def stream_timeout_s(self) -> float | None:
        return self.timeout_s


def add_connection_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Adds the flags every command shares."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--store",
        metavar="HOST:PORT",
        default=environ.get("ADAPTERSTORE_ADDR", DEFAULT_STORE_ADDRESS),
        help=f"adapter store address (env ADAPTERSTORE_ADDR; default {DEFAULT_STORE_ADDRESS})",
    )
    group.add_argument(
        "--inference",
        metavar="ADDRESS",
        default=environ.get("INFERENCE_ADDR", DEFAULT_INFERENCE_ADDRESS),
        help="inference service address, for `generate`: HOST:PORT, or several replicas "
        "routed by adapter as IP:PORT,IP:PORT,... or dns:///NAME:PORT "
        f"(env INFERENCE_ADDR; default {DEFAULT_INFERENCE_ADDRESS})",
    )
    group.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=positive_float,
        default=_env_timeout(environ),
        help=f"deadline of each call (env {ENV_PREFIX}_TIMEOUT; default "
        f"{DEFAULT_UNARY_TIMEOUT_S:g} s for single calls, none for push, watch and generate)",
    )
    group.add_argument(
        "--json", action="store_true", help="print results as JSON instead of tables"
    )
    add_client_security_flags(parser, ENV_PREFIX, environ)
    add_client_security_flags(parser, ENV_PREFIX, environ, flag_prefix="inference")


def settings_from_args(args: argparse.Namespace) -> CtlSettings:
    try:
        store_security = client_security_from_args(args)
        inference_security = client_security_from_args(args, "inference")
    except InvalidArgument as exc:
        raise UsageError(exc.message) from exc
    if not _configured(inference_security):
        # One deployment usually shares its token and CA between both services.
        inference_security = store_security
    return CtlSettings(
        store_address=args.store,
        inference_address=args.inference,
        store_security=store_security,
        inference_security=inference_security,
        timeout_s=args.timeout,
        json=args.json,
    )


def _configured(security: ClientSecurity) -> bool:
    return bool(security.token or security.tls or security.tls_ca_file or security.tls_cert_file)


def _env_timeout(environ: Mapping[str, str]) -> float | None:
    text = environ.get(f"{ENV_PREFIX}_TIMEOUT")
    if not text:
        return None
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{ENV_PREFIX}_TIMEOUT: {exc}") from None


@dataclass(frozen=True)
class PushTracing:
    """How one push is traced: recorded and exported when `endpoint` is set, recorded
    (every push sampled) and its trace id printed with `--trace`, not at all otherwise."""

    # `--trace`: print the trace id; the store's and replicas' spans share it.
    show: bool = False
    # Where adapterctl's own spans go over OTLP/gRPC; None: nowhere (with --trace the
    # trace still reaches the store and the replicas, whose spans carry its id).
    endpoint: str | None = None
    # OTEL_SERVICE_NAME, or adapterctl's own name.
    service_name: str = "loraserve-adapterctl"

    @property
    def on(self) -> bool:
        return self.show or self.endpoint is not None


def add_push_tracing_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    group = parser.add_argument_group("tracing")
    group.add_argument(
        "--trace",
        action="store_true",
        help="trace this push across the fleet: prints its trace id on stderr "
        '(trace_id=..., and "trace_id" with --json), which the store\'s and the '
        "replicas' spans share",
    )
    group.add_argument(
        "--otlp-traces-endpoint",
        metavar="URL",
        default=_env_endpoint(environ),
        help="send this push's spans here over OTLP/gRPC (e.g. http://collector:4317; env "
        f"{ENV_PREFIX}_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or "
        "OTEL_EXPORTER_OTLP_ENDPOINT unless OTEL_TRACES_EXPORTER=none); unset: adapterctl "
        "exports nothing",
    )
    parser.set_defaults(service_name=environ.get("OTEL_SERVICE_NAME") or PushTracing.service_name)


def push_tracing_from_args(args: argparse.Namespace) -> PushTracing:
    try:
        endpoint = otlp_endpoint(args.otlp_traces_endpoint) if args.otlp_traces_endpoint else None
    except InvalidArgument as exc:
        raise UsageError(f"--otlp-traces-endpoint: {exc.message}") from None
    return PushTracing(bool(args.trace), endpoint, args.service_name)


def _env_endpoint(environ: Mapping[str, str]) -> str | None:
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return environ.get(_ENDPOINT_ENV[0]) or None
    return next((environ[name] for name in _ENDPOINT_ENV if environ.get(name)), None)
