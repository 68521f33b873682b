"""Where adapterctl reads and writes: the real terminal, or buffers in tests."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from typing import TextIO

from loraserve.adapterctl.terminal.output import printable


@dataclass(frozen=True)
class Console:
    """The process's standard streams. Results go to stdout, everything else to stderr,
    so `adapterctl push ... | xargs` sees only `NAME@REV`. Everything written is
    `printable` first: what servers say cannot drive the terminal."""

    stdout: TextIO
    stderr: TextIO
    stdin: TextIO

    @classmethod
    def system(cls) -> Console:
        return cls(sys.stdout, sys.stderr, sys.stdin)

    def out(self, text: str, end: str = "\n", *, multiline: bool = False) -> None:
        """Writes a result; `multiline` keeps its newlines and tabs (a table, generated
        text), otherwise it is one line whatever it holds."""
        self.stdout.write(printable(text, multiline=multiline) + end)
        # Results are flushed at once: `push --watch` and `generate` stream them.
        self.stdout.flush()

    def err(self, text: str) -> None:
        self.stderr.write(f"adapterctl: {printable(text)}\n")
        self.stderr.flush()

    @property
    def stdout_is_tty(self) -> bool:
        return _isatty(self.stdout)

    @property
    def stderr_is_tty(self) -> bool:
        return _isatty(self.stderr)

    @property
    def stdin_is_tty(self) -> bool:
        return _isatty(self.stdin)

    async def confirm(self, question: str) -> bool:
        """Asks a yes/no question on stderr; only an explicit yes counts."""
        self.stderr.write(f"{printable(question)} [y/N] ")
        self.stderr.flush()
        answer = await asyncio.to_thread(self.stdin.readline)
        return answer.strip().lower() in ("y", "yes")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except ValueError:  # a closed stream
        return False
