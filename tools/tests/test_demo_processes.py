"""Supervised children stop cleanly, and a child that will not stop is killed with its
own children, so the run command leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
from pathlib import Path

from loraserve.demo.processes import ChildProcess

# Starts a grandchild, prints both pids, then ignores SIGTERM and sleeps.
_STUBBORN = textwrap.dedent(
    """
    import signal, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("pids", grandchild.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes, but kill(0) still succeeds on it.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def _wait_for_line(child: ChildProcess, prefix: str) -> str:
    for _ in range(200):
        for line in child.tail():
            if line.startswith(prefix):
                return line
        await asyncio.sleep(0.05)
    raise AssertionError(f"no line starting {prefix!r}: {child.tail()}")


async def test_child_output_is_kept_in_its_log_file(tmp_path: Path) -> None:
    child = ChildProcess("echo", [sys.executable, "-c", "print('hello')"], tmp_path / "echo.log")
    await child.start()
    assert await child.wait() == 0
    assert (tmp_path / "echo.log").read_text() == "hello\n"


async def test_stop_ends_a_child_that_honours_sigterm(tmp_path: Path) -> None:
    child = ChildProcess(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "s.log"
    )
    await child.start()
    assert await child.stop(timeout_s=30) != 0
    assert child.pid is not None
    assert not _alive(child.pid)


async def test_stop_kills_a_stubborn_child_and_its_children(tmp_path: Path) -> None:
    child = ChildProcess("stubborn", [sys.executable, "-c", _STUBBORN], tmp_path / "b.log")
    await child.start()
    grandchild = int((await _wait_for_line(child, "pids")).split()[1])
    await child.stop(timeout_s=0.5)
    assert child.pid is not None
    assert not _alive(child.pid)
    for _ in range(100):
        if not _alive(grandchild):
            break
        await asyncio.sleep(0.05)
    assert not _alive(grandchild)
