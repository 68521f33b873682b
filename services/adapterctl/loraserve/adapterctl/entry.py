"""The `adapterctl` command's entry point.

Importing the command line (grpc, protobuf, the stubs) takes a noticeable moment;
Ctrl-C during it would end in a KeyboardInterrupt traceback. Here SIGINT exits
with the interrupted status (130) quietly until the imports are done, and from then
on `cli.main` handles Ctrl-C itself. Nothing heavy is imported at this module's top.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType

# The documented exit code of an interrupted command (`failures.EXIT_INTERRUPTED`,
# which this module must not import: it loads grpc).
EXIT_INTERRUPTED = 130


def _exit_interrupted(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(EXIT_INTERRUPTED)


def main() -> int:
    previous = signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        from loraserve.adapterctl.cli import main as run_command_line
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        return run_command_line(sys.argv[1:])
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
