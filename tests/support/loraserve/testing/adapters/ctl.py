"""Running adapterctl in-process in tests, and writing adapter directories."""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from loraserve.adapterctl.cli import run
from loraserve.adapterctl.terminal.console import Console
from loraserve.testing.adapters.files import tiny_adapter


class TtyBuffer(io.StringIO):
    """A buffer that claims to be a terminal."""

    def isatty(self) -> bool:
        return True


@dataclass(frozen=True)
class CtlResult:
    code: int
    out: str
    err: str


def buffers(stdin: str = "", tty: bool = False) -> Console:
    kind = TtyBuffer if tty else io.StringIO
    return Console(kind(), kind(), kind(stdin))


async def ctl(
    *argv: str,
    env: Mapping[str, str] | None = None,
    stdin: str = "",
    tty: bool = False,
    console: Console | None = None,
) -> CtlResult:
    """Runs one adapterctl command line on the test's event loop."""
    console = console or buffers(stdin, tty)
    code = await run(list(argv), env or {}, console)
    return CtlResult(code, output(console.stdout), output(console.stderr))


def output(stream: object) -> str:
    assert isinstance(stream, io.StringIO)
    return stream.getvalue()


def write_adapter_dir(directory: Path, rank: int = 4, seed: int = 0) -> Path:
    """A valid PEFT LoRA adapter directory, small enough for unit tests."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in tiny_adapter(rank=rank, seed=seed).items():
        (directory / name).write_bytes(data)
    return directory
