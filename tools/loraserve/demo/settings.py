"""The run command's one settings object, parsed once from flags with env fallbacks.

Every flag falls back to `LORASERVE_<FLAG>` in the environment (dashes as
underscores). The servers it starts inherit the environment, so their own
`ADAPTERSTORE_*` and `INFERENCE_*` variables configure them as usual.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loraserve.common.config.flags import EnvFlags, port, positive_float
from loraserve.common.errors import InvalidArgument
from loraserve.common.rpc.security import (
    ClientSecurity,
    add_client_security_flags,
    client_security_from_args,
)

ENV_PREFIX = "LORASERVE"
# adapterctl's variables, so that the run command's own calls (health, pushes, the
# showcase) authenticate as the user's adapterctl does.
CLIENT_ENV_PREFIX = "ADAPTERCTL"
DEFAULT_STORE_PORT = 50051
DEFAULT_INFERENCE_PORT = 50052
DEFAULT_BUCKET = "loraserve"


@dataclass(frozen=True)
class S3Options:
    """Where the store keeps adapters; no endpoint means an embedded one."""

    endpoint: str | None
    bucket: str
    prefix: str
    region: str | None

    @property
    def embedded(self) -> bool:
        return self.endpoint is None


@dataclass(frozen=True)
class RunSettings:
    """Everything the run command runs with."""

    # None: the demo model, trained on first use.
    model: str | None
    s3: S3Options
    host: str
    store_port: int
    inference_port: int
    # Built models, adapters and the demo's training cache.
    cache_dir: Path
    # Logs, the inference service's adapter cache.
    state_dir: Path
    publish_demo_adapters: bool
    showcase: bool
    echo_logs: bool
    store_args: tuple[str, ...]
    inference_args: tuple[str, ...]
    client_security: ClientSecurity
    ready_timeout_s: float
    stop_timeout_s: float

    @property
    def store_address(self) -> str:
        return f"{self.host}:{self.store_port}"

    @property
    def inference_address(self) -> str:
        return f"{self.host}:{self.inference_port}"


def _yes(text: str | None) -> bool | None:
    if text is None:
        return None
    return text.strip().lower() in ("1", "true", "yes", "on")


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    """The run command line; defaults come from `environ`."""
    parser = argparse.ArgumentParser(
        prog="python -m loraserve.demo",
        description="Run loraserve on this machine: object storage, the adapter store and "
        "the inference service, until Ctrl-C. Without --model: the tiny demo model with "
        "demo adapters and an embedded S3 endpoint.",
    )
    flags = EnvFlags(environ, ENV_PREFIX)
    flags.add(parser, "model", "model to serve (path or name); default: the demo model")
    _add_storage_flags(parser, flags)
    _add_network_flags(parser, flags)
    _add_demo_flags(parser, flags)
    _add_server_flags(parser, flags)
    add_client_security_flags(parser, CLIENT_ENV_PREFIX, environ)
    return parser


def _add_storage_flags(parser: argparse.ArgumentParser, flags: EnvFlags) -> None:
    env = flags.get
    storage = parser.add_argument_group("object storage")
    storage.add_argument(
        "--s3-endpoint",
        default=env("s3-endpoint"),
        help="S3-compatible endpoint URL; default: an embedded one "
        f"(env {flags.env_name('s3-endpoint')}). "
        "Credentials: ADAPTERSTORE_ACCESS_KEY_ID/SECRET_ACCESS_KEY or boto3's usual chain",
    )
    flags.add(storage, "bucket", "bucket", DEFAULT_BUCKET)
    storage.add_argument("--prefix", default=env("prefix", ""), help="key prefix in the bucket")
    storage.add_argument("--region", default=env("region"), help="S3 region")


def _add_network_flags(parser: argparse.ArgumentParser, flags: EnvFlags) -> None:
    env = flags.get
    network = parser.add_argument_group("network")
    network.add_argument(
        "--host", default=env("host", "127.0.0.1"), help="address both servers listen on"
    )
    network.add_argument(
        "--store-port",
        type=port,
        default=env("store-port", str(DEFAULT_STORE_PORT)),
        help="adapter store port (0: any free port)",
    )
    network.add_argument(
        "--inference-port",
        type=port,
        default=env("inference-port", str(DEFAULT_INFERENCE_PORT)),
        help="inference service port (0: any free port)",
    )


def _add_demo_flags(parser: argparse.ArgumentParser, flags: EnvFlags) -> None:
    env = flags.get
    demo = parser.add_argument_group("demo")
    demo.add_argument(
        "--demo-adapters",
        action=argparse.BooleanOptionalAction,
        default=_yes(env("demo-adapters")),
        help="publish the demo adapters (default: only with the demo model)",
    )
    demo.add_argument(
        "--showcase",
        action=argparse.BooleanOptionalAction,
        default=_yes(env("showcase")),
        help="show two adapters answering one prompt, and a push during a stream "
        "(default: with the demo adapters)",
    )

    files = parser.add_argument_group("files")
    files.add_argument(
        "--cache-dir",
        type=Path,
        default=env("cache-dir", ".cache/demo"),
        help="where the demo model and adapters are trained and kept",
    )
    files.add_argument(
        "--state-dir",
        type=Path,
        default=env("state-dir", ".cache/run"),
        help="logs and the inference service's adapter cache",
    )
    files.add_argument(
        "--echo-logs",
        action=argparse.BooleanOptionalAction,
        default=_yes(env("echo-logs")) or False,
        help="also print the servers' logs here, each line prefixed with its server",
    )


def _add_server_flags(parser: argparse.ArgumentParser, flags: EnvFlags) -> None:
    env = flags.get
    servers = parser.add_argument_group("servers")
    servers.add_argument(
        "--store-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `adapterstore serve` (repeatable), "
        "e.g. --store-arg=--log-level=DEBUG",
    )
    servers.add_argument(
        "--inference-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `inference serve` (repeatable), "
        "e.g. --inference-arg=--max-loras=8",
    )
    servers.add_argument(
        "--ready-timeout",
        type=positive_float,
        default=env("ready-timeout", "900"),
        help="seconds each server gets to report SERVING",
    )
    servers.add_argument(
        "--stop-timeout",
        type=positive_float,
        default=env("stop-timeout", "30"),
        help="seconds each server gets to stop after SIGTERM before it is killed",
    )


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> RunSettings:
    """Parses the command line; raises InvalidArgument for inconsistent flags."""
    args = build_parser(environ).parse_args(list(argv))
    demo_model = args.model is None
    publish = args.demo_adapters if args.demo_adapters is not None else demo_model
    if publish and not demo_model:
        # The demo adapters are trained for the demo model; any other model refuses them.
        raise InvalidArgument("--demo-adapters needs the demo model: leave out --model")
    showcase = args.showcase if args.showcase is not None else publish
    if showcase and not publish:
        raise InvalidArgument("--showcase needs the demo adapters (--demo-adapters)")
    return RunSettings(
        model=args.model,
        s3=S3Options(
            endpoint=args.s3_endpoint or None,
            bucket=args.bucket,
            prefix=args.prefix,
            region=args.region or None,
        ),
        host=args.host,
        store_port=args.store_port,
        inference_port=args.inference_port,
        cache_dir=args.cache_dir,
        state_dir=args.state_dir,
        publish_demo_adapters=publish,
        showcase=showcase,
        echo_logs=args.echo_logs,
        store_args=tuple(args.store_arg),
        inference_args=tuple(args.inference_arg),
        client_security=client_security_from_args(args),
        ready_timeout_s=float(args.ready_timeout),
        stop_timeout_s=float(args.stop_timeout),
    )
