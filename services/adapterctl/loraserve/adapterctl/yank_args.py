"""`adapterctl yank` and `unyank`'s command line, parsed where the rest is (the commands
themselves, in commands/yank.py, load the store's protos only when they run)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

# Adds one subcommand: name, handler, help text (cli.py's `command`).
Command = Callable[..., argparse.ArgumentParser]


def add_yank(command: Command, handler: Callable[[str], Any]) -> None:
    """`yank NAME@REV --reason TEXT` and `unyank NAME@REV`; `handler(name)` is the
    lazily imported command `name`."""
    yank = command(
        "yank",
        handler("cmd_yank"),
        "mark a revision as one no inference replica serves pinned (NAME@REV), nor the "
        "store makes current or rolls out, until unyanked",
    )
    _revision_ref(yank)
    yank.add_argument(
        "--reason",
        required=True,
        help="why, kept with the yank and shown in every refused request (at most 1 KiB)",
    )
    unyank = command("unyank", handler("cmd_unyank"), "lift a revision's yank")
    _revision_ref(unyank)


def _revision_ref(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ref", metavar="NAME@REV", help="the adapter's revision")
