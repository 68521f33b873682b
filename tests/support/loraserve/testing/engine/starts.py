"""Engine starts across the suite's workers (pytest-xdist). The session's fleet starts
three engines at once, which takes both cores for a minute; an engine another worker
starts beside them makes every one of them slower, and the fleet's start once came
near its guard. So every engine start holds a shared lock on one file of the run, and
the fleet's start holds it alone: engine starts of the other worker wait while the
fleet starts, and the fleet waits for those already under way. One process (no xdist)
starts nothing beside itself and takes no lock. Registered as a plugin too: xdist's
controller removes the run's lock file when the run ends."""

from __future__ import annotations

import asyncio
import contextvars
import fcntl
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

log = logging.getLogger(__name__)

# Set while this task (or the task that started it) holds the lock: the fleet's own
# replica starts run under its exclusive hold and take nothing more (flock is per open
# file, so a second hold in this process would wait on the first).
_held: contextvars.ContextVar[bool] = contextvars.ContextVar("engine_start_held", default=False)
# How often a start waiting for the lock tries again: polled, not a blocking flock in a
# thread, so a cancelled start leaves no thread behind to take the lock later.
_POLL_S = 0.1


def _lock_path() -> Path | None:
    """The run's lock file, shared by its workers; None outside xdist."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return _run_lock(run) if run else None


def _run_lock(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"loraserve-engine-starts-{run}.lock"


_RUN = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """On xdist's controller: notes the run whose lock file to remove at its end."""
    node.config.stash[_RUN] = node.workerinput["testrunuid"]


def pytest_sessionfinish(session: pytest.Session) -> None:
    # On the controller, once every worker is down: no start can hold the file any more.
    run = session.config.stash.get(_RUN, None)
    if run is not None:
        _run_lock(run).unlink(missing_ok=True)


@asynccontextmanager
async def engine_starting(*, alone: bool = False) -> AsyncIterator[None]:
    """Holds the run's engine-start lock for the block: shared, or with `alone` the
    only holder."""
    path = _lock_path()
    if path is None or _held.get():
        yield
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        mode = (fcntl.LOCK_EX if alone else fcntl.LOCK_SH) | fcntl.LOCK_NB
        asked = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, mode)
                break
            except BlockingIOError:
                await asyncio.sleep(_POLL_S)
        waited = time.monotonic() - asked
        if waited >= _POLL_S:
            log.info("engine_start.waited seconds=%.1f alone=%s", waited, alone)
        token = _held.set(True)
        try:
            yield
        finally:
            _held.reset(token)
    finally:
        os.close(fd)
