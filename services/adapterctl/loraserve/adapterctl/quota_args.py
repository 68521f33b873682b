"""`adapterctl quota`'s command line, parsed where the rest is (the commands themselves,
in commands/quota.py, load the store's protos only when they run)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_quota(
    commands: Any, common: argparse.ArgumentParser, handler: Callable[[str], Any]
) -> None:
    """`quota set|show|clear`; `handler(name)` is the lazily imported command `name`."""
    quota = commands.add_parser(
        "quota",
        help="per-adapter quotas, enforced by each inference replica on its own requests",
        description="Per-adapter quotas: sequences in flight (a request counts its n) and "
        "tokens (prompt and generated) per second and per minute, per inference replica "
        "(a fleet of N replicas admits N times them). See docs/adapterctl.md.",
        allow_abbrev=False,
    )
    steps = quota.add_subparsers(dest="quota_command", required=True, metavar="STEP")

    def step(name: str, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = steps.add_parser(
            name, parents=[common], help=help_text, description=help_text, allow_abbrev=False
        )
        sub.set_defaults(handler=handler(f"cmd_quota_{name}"))
        return sub

    change = step("set", "set the quota of NAME (or, with --default, of every adapter without one)")
    _name_or_default(change)
    change.add_argument(
        "--max-in-flight",
        type=int,
        metavar="N",
        help="sequences running at once, per replica (a request counts its n; one of more "
        "is refused): 1 to 1000000",
    )
    change.add_argument(
        "--tokens-per-second",
        type=float,
        metavar="N",
        help="prompt and generated tokens per second, per replica: 1 to 1e9",
    )
    change.add_argument(
        "--tokens-per-minute",
        type=float,
        metavar="N",
        help="prompt and generated tokens per minute, per replica: 1 to 1e9",
    )
    clear = step("clear", "lift the quota of NAME (or, with --default, the default quota)")
    _name_or_default(clear)
    show = step("show", "the default quota and every adapter's own (or NAME's)")
    show.add_argument("name", metavar="NAME", nargs="?", default="", help="adapter name")


def _name_or_default(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", nargs="?", default="", help="adapter name")
    parser.add_argument(
        "--default",
        action="store_true",
        help="the default quota of every adapter without its own, instead of NAME's",
    )
