"""Child processes the run command supervises: started, logged, waited on, stopped.

Each child runs in a session of its own, so the terminal's Ctrl-C reaches only the
supervisor, which then stops the children in order (inference before the store it
reads from). A stop is SIGTERM to the child, a grace period for it to stop itself
and its own children (vLLM's engine process), then SIGKILL to its whole process
group, so nothing is left behind even when a child hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

log = logging.getLogger(__name__)

# Lines of a child's output kept in memory, to show why it failed.
_TAIL_LINES = 40


class ChildProcess:
    """One supervised child; its output goes to a log file (and optionally to `echo`)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        echo: TextIO | None = None,
    ) -> None:
        self.name = name
        self.argv = tuple(argv)
        self.log_path = log_path
        self._env = dict(env) if env is not None else None
        self._echo = echo
        self._tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._process: asyncio.subprocess.Process | None = None
        self._pump: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    def tail(self) -> list[str]:
        """The last lines the child wrote."""
        return list(self._tail)

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._process = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=self._env,
            start_new_session=True,
        )
        self._pump = asyncio.create_task(self._copy_output(), name=f"{self.name}-output")
        log.info(
            "run.child_started name=%s pid=%d log=%s", self.name, self._process.pid, self.log_path
        )

    async def wait(self) -> int:
        """Waits until the child has exited and its output is written; its exit status."""
        assert self._process is not None
        code = await self._process.wait()
        if self._pump is not None:
            await self._pump
        return code

    async def stop(self, timeout_s: float) -> int | None:
        """SIGTERM, `timeout_s` to exit, then SIGKILL to its process group; its exit status.

        With `timeout_s` 0, SIGKILL at once.
        """
        process = self._process
        if process is None:
            return None
        if process.returncode is None and timeout_s > 0:
            log.info("run.child_stopping name=%s pid=%d", self.name, process.pid)
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), timeout_s)
            except TimeoutError:
                log.warning(
                    "run.child_killed name=%s pid=%d: no exit %.0f s after SIGTERM",
                    self.name,
                    process.pid,
                    timeout_s,
                )
        # The group may outlive its leader (an engine process whose parent died).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        return await self.wait()

    async def _copy_output(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        prefix = f"[{self.name}] "
        # One log per run: what a person opens is what this run wrote.
        with self.log_path.open("w", encoding="utf-8", errors="replace") as out:
            while line := await self._process.stdout.readline():
                text = line.decode("utf-8", errors="replace")
                out.write(text)
                out.flush()
                self._tail.append(text.rstrip("\n"))
                if self._echo is not None:
                    self._echo.write(prefix + text)
                    self._echo.flush()


def python_module(module: str, *args: str) -> list[str]:
    """argv that runs `module` with this interpreter, so the same environment serves it."""
    return [sys.executable, "-m", module, *args]
