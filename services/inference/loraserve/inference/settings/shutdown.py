"""How a replica shuts down on SIGTERM: how long it keeps serving new calls while its
health says NOT_SERVING, then how long running streams get."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from loraserve.common.config.flags import non_negative_float


def add_shutdown_flags(
    serve: argparse.ArgumentParser, env: Callable[[str, str], str | None]
) -> None:
    serve.add_argument(
        "--shutdown-delay",
        type=non_negative_float,
        default=env("shutdown-delay", "0"),
        help="seconds between SIGTERM and the grace: health says NOT_SERVING while new "
        "calls are still served, so load balancers (HAProxy's checks, Kubernetes' "
        "readiness probe) stop sending them first; longer than their detection time",
    )
    serve.add_argument(
        "--shutdown-grace",
        type=float,
        default=env("shutdown-grace", "30"),
        help="seconds running streams get to finish on SIGTERM",
    )
