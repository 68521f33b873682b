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

DEFAULT_STORE_ADDRESS = "127.0.0.1:50051"
DEFAULT_INFERENCE_ADDRESS = "127.0.0.1:50052"
# Unary calls answer in milliseconds; streams (push, watch, generate) run as long as
# they need unless --timeout bounds them.
DEFAULT_UNARY_TIMEOUT_S = 30.0
ENV_PREFIX = "ADAPTERCTL"


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
