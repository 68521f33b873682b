"""`python -m loraserve.common.rpc.healthcheck [--service NAME] [--tls-ca CA [--tls-cert
CERT --tls-key KEY]] HOST:PORT`: exit 0 when the server's gRPC health is SERVING, 1
otherwise (the reason on stderr), 2 for bad usage. For container health checks:
Kubernetes' own gRPC probes speak no TLS, so a server that requires client certificates
is probed by running this inside its container."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from loraserve.common.rpc.security import ClientSecurity

_SERVING = "SERVING"
# Seconds a check waits for its answer; a probe running this must allow for more.
DEFAULT_TIMEOUT_S = 3.0


def health_status(
    address: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    service: str = "",
    credentials: grpc.ChannelCredentials | None = None,
) -> str:
    """The health of `service` ("" = the whole server) at `address`: SERVING,
    NOT_SERVING, ..., or why the check got no answer (`UNAVAILABLE: ...`)."""
    try:
        with (
            grpc.insecure_channel(address)
            if credentials is None
            else grpc.secure_channel(address, credentials)
        ) as channel:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
    except grpc.RpcError as exc:
        return f"{exc.code().name}: {exc.details()}"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def is_serving(
    address: str,
    timeout: float = DEFAULT_TIMEOUT_S,
    *,
    service: str = "",
    credentials: grpc.ChannelCredentials | None = None,
) -> bool:
    return health_status(address, timeout, service=service, credentials=credentials) == _SERVING


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m loraserve.common.rpc.healthcheck",
        description="Exit 0 when a gRPC server's health is SERVING, 1 otherwise.",
    )
    parser.add_argument("address", metavar="HOST:PORT", help="the server to ask")
    parser.add_argument(
        "--service",
        default="",
        metavar="NAME",
        help='the health of this registered service (default "": the whole server)',
    )
    parser.add_argument(
        "--tls-ca", type=Path, help="CA bundle to verify the server (PEM); implies TLS"
    )
    parser.add_argument(
        "--tls-cert", type=Path, help="client certificate (PEM), for servers requiring mTLS"
    )
    parser.add_argument("--tls-key", type=Path, help="the client certificate's key (PEM)")
    return parser


def _credentials(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> grpc.ChannelCredentials | None:
    """The channel credentials the TLS flags ask for; exits 2 for unusable ones."""
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key must be given together")
    if args.tls_cert and not args.tls_ca:
        # The system roots would not verify a server of a private CA, which is the case
        # a probe presenting a client certificate is for.
        parser.error("--tls-cert needs --tls-ca, the CA that signed the server's certificate")
    try:
        return ClientSecurity(
            tls_ca_file=args.tls_ca, tls_cert_file=args.tls_cert, tls_key_file=args.tls_key
        ).channel_credentials()
    except OSError as exc:
        parser.error(f"cannot read {exc.filename}: {exc.strerror}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    credentials = _credentials(parser, args)
    status = health_status(args.address, service=args.service, credentials=credentials)
    if status == _SERVING:
        return 0
    # Kubelet records a failed exec probe's output in the pod's events.
    sys.stderr.write(f"{args.address} {args.service or '(server)'}: {status}\n")
    return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
