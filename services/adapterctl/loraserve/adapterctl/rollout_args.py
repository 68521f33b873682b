"""`adapterctl rollout`'s command line, parsed where the rest is (the commands themselves,
in commands/rollout.py, load the store's protos only when they run)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from loraserve.adapterctl.fleet_wait_args import add_wait_flag
from loraserve.common.config.flags import positive_float, positive_int
from loraserve.common.config.textlimits import MAX_ROLLOUT_CALLERS


def _min_callers(text: str) -> int:
    value = positive_int(text)
    # Replicas report a revision's most recent callers only: more could never be seen.
    if value > MAX_ROLLOUT_CALLERS:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_ROLLOUT_CALLERS}, got {value}")
    return value


def add_rollout(
    commands: Any, common: argparse.ArgumentParser, handler: Callable[[str], Any]
) -> None:
    """`rollout start|set|status|promote|abort`; `handler(name)` is the lazily imported
    command `name`."""
    rollout = commands.add_parser(
        "rollout",
        help="canary rollouts: a share of an adapter's requests to another revision",
        description="Canary rollouts of an adapter revision (see docs/adapterctl.md).",
        allow_abbrev=False,
    )
    steps = rollout.add_subparsers(dest="rollout_command", required=True, metavar="STEP")

    def step(name: str, help_text: str, wait: str = "") -> Any:
        sub = steps.add_parser(
            name, parents=[common], help=help_text, description=help_text, allow_abbrev=False
        )
        sub.set_defaults(handler=handler(f"cmd_rollout_{name}"))
        sub.add_argument("name", metavar="NAME", help="adapter name")
        if wait:
            add_wait_flag(sub, wait)
        return sub

    start = step(
        "start",
        "send a share of NAME's requests to revision REV",
        "routes the candidate (or refuses it)",
    )
    start.add_argument("revision", metavar="REV", type=positive_int, help="candidate revision")
    start.add_argument("--weight", type=float, required=True, help="percent to REV, 0 to 100")
    _add_guard_flags(start)
    weight = step("set", "change the share of NAME's rollout", "applies it")
    weight.add_argument("--weight", type=float, required=True, help="percent, 0 to 100")
    step("status", "the rollout of NAME, both arms' figures, why it ended")
    promote = step("promote", "make the candidate current and end the rollout", "applies it")
    promote.add_argument(
        "--expect",
        type=positive_int,
        required=True,
        metavar="REV",
        help="the candidate revision you reviewed (rollout status shows it); a rollout of "
        "another candidate is not promoted (ABORTED)",
    )
    promote.add_argument(
        "--force",
        action="store_true",
        help="promote even while live replicas refuse (NACK) the candidate",
    )
    abort = step("abort", "end the rollout; every request to the current revision", "applies it")
    abort.add_argument("--reason", default="", help="why, kept with the rollout")


def _add_guard_flags(start: argparse.ArgumentParser) -> None:
    guards = start.add_argument_group("guards: when the store aborts the rollout by itself")
    guards.add_argument(
        "--no-abort-on-nack",
        dest="abort_on_nack",
        action="store_false",
        help="do not abort when a replica refuses the candidate (default: abort)",
    )
    guards.add_argument(
        "--max-error-rate-margin",
        type=float,
        metavar="PP",
        help="abort when the candidate's error rate exceeds the current's by more than PP "
        "percentage points",
    )
    guards.add_argument(
        "--max-ttft-p95-margin",
        type=float,
        metavar="PCT",
        help="abort when the candidate's TTFT p95 exceeds the current's by more than PCT %%",
    )
    guards.add_argument(
        "--window",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="the figures' window (default 60)",
    )
    guards.add_argument(
        "--min-requests",
        type=positive_int,
        default=20,
        metavar="N",
        help="requests each arm needs in the window before it is judged (default 20)",
    )
    guards.add_argument(
        "--min-callers",
        type=_min_callers,
        default=3,
        metavar="N",
        help="distinct callers (token principals, trusted rollout keys or addresses) each "
        f"arm needs in the window before it is judged, 1 to {MAX_ROLLOUT_CALLERS} (default 3)",
    )
