"""`haproxy-placement`: keeps HAProxy's adapter placement map (deploy/haproxy/) the
placement the client library would choose, from the replicas' own load reports. Runs
beside HAProxy, on its admin socket; each flag falls back to HAPROXY_PLACEMENT_<FLAG>."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from loraserve.clients.balancing import BoundedLoad
from loraserve.clients.channels import open_channel
from loraserve.common.config.flags import EnvFlags, parse_args, positive_float
from loraserve.common.errors import LoraserveError
from loraserve.common.rpc.security import (
    ClientSecurity,
    add_client_security_flags,
    client_security_from_args,
)
from loraserve.haproxyplacement.agent import HaproxyPlacement
from loraserve.haproxyplacement.runtime_api import RuntimeApi

log = logging.getLogger(__name__)

ENV_PREFIX = "HAPROXY_PLACEMENT"
# The flags naming how the agent calls the replicas: --replica-token, --replica-tls-ca, ...
REPLICA_FLAG_PREFIX = "replica"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


@dataclass(frozen=True)
class Settings:
    """What the agent is told, parsed once."""

    haproxy_socket: str
    backend: str
    map_file: str
    policy: BoundedLoad
    replica_security: ClientSecurity
    log_level: str


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haproxy-placement", description=__doc__)
    env = EnvFlags(environ, ENV_PREFIX)
    env.add(
        parser,
        "haproxy-socket",
        "HAProxy's runtime API: the `stats socket` path, or HOST:PORT of an ipv4@ one",
        default="/run/haproxy/admin.sock",
    )
    env.add(parser, "backend", "the backend whose servers are the replicas", default="replicas")
    env.add(
        parser,
        "map",
        "the map file the backend's use-server reads, as HAProxy names it",
        default="/etc/haproxy/placement.map",
    )
    env.add(
        parser,
        "balance-factor",
        "the most load a replica is given, as a multiple of the fleet's mean",
        default=str(BoundedLoad.balance_factor),
        type=positive_float,
    )
    env.add(
        parser,
        "placement-interval",
        "seconds between placements written to HAProxy",
        default=str(BoundedLoad.placement_interval_s),
        type=positive_float,
    )
    env.add(parser, "log-level", "logging level", default="INFO")
    add_client_security_flags(parser, ENV_PREFIX, environ, REPLICA_FLAG_PREFIX)
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    parser = build_parser(environ)
    args = parse_args(parser, argv)
    return Settings(
        haproxy_socket=args.haproxy_socket,
        backend=args.backend,
        map_file=args.map,
        policy=BoundedLoad(
            balance_factor=float(args.balance_factor),
            placement_interval_s=float(args.placement_interval),
        ),
        replica_security=client_security_from_args(args, REPLICA_FLAG_PREFIX),
        log_level=args.log_level.upper(),
    )


async def run(settings: Settings, api: RuntimeApi) -> None:
    agent = HaproxyPlacement(
        api,
        settings.backend,
        settings.map_file,
        settings.policy,
        partial(open_channel, security=settings.replica_security),
    )
    log.info(
        "placement.started haproxy=%s backend=%s map=%s",
        settings.haproxy_socket,
        settings.backend,
        settings.map_file,
    )
    await agent.run()


def main(argv: Sequence[str] | None = None) -> None:
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, os.environ)
        api = RuntimeApi(settings.haproxy_socket)
    except LoraserveError as exc:
        sys.stderr.write(f"haproxy-placement: {exc.message}\n")
        raise SystemExit(2) from exc
    logging.basicConfig(level=settings.log_level, format=LOG_FORMAT)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(settings, api))


if __name__ == "__main__":
    main()
