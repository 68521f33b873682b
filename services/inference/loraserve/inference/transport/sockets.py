"""The private directory of the grpc.aio server's Unix socket behind the native transport.

A server stopped by a signal it can handle removes its directory; one killed (SIGKILL, the
OOM killer) cannot, so each start first removes those whose server is gone. A directory
names its server's pid in a file of its own; one without it (being made, or made by
another version) is left alone."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "loraserve-grpc-"
OWNER = "owner.pid"


def make_socket_dir() -> Path:
    """A new directory only this user may enter, after removing those killed servers left."""
    _remove_abandoned(Path(tempfile.gettempdir()))
    directory = Path(tempfile.mkdtemp(prefix=PREFIX))
    (directory / OWNER).write_text(str(os.getpid()))
    return directory


def _remove_abandoned(parent: Path) -> None:
    for directory in parent.glob(f"{PREFIX}*"):
        try:
            pid = int((directory / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if not _alive(pid):
            shutil.rmtree(directory, ignore_errors=True)
            log.info("server.socket_dir_removed path=%s dead_pid=%d", directory, pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
