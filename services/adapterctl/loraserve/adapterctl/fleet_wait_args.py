"""`--wait`'s value, parsed where the command line is (without the store's protos)."""

from __future__ import annotations

import argparse


def parse_wanted(text: str) -> int | None:
    """`all` (None: every live replica) or a positive number of replicas."""
    if text == "all":
        return None
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise ValueError(f"--wait takes 'all' or a number of replicas >= 1, got {text!r}")
    return int(text)


def _wanted(text: str) -> str:
    try:
        parse_wanted(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_wait_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """`--wait [all|N]`: after the command, wait until the replicas' reports say `what`."""
    parser.add_argument(
        "--wait",
        nargs="?",
        const="all",
        type=_wanted,
        metavar="all|N",
        help=f"then wait until every live inference replica (or N of them) {what}; "
        "exit 1 naming each that refused it, 3 naming each that did not answer within "
        "--timeout (default 120 s)",
    )
