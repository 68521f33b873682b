"""Trains the demo model in the background from the start of a session that runs
`tests/test_run_command.py` or `tools/tests/test_demo_model.py`. On a fresh clone that
training is minutes of one core which their fixtures would otherwise spend alone at their
setup; started at collection, it overlaps the tests before it. Both wait for it
(`demo_trained`) rather than train beside it: the build has no lock, and each would train
the whole demo again. The run command still finds the demo through its own check
(`is_demo_built`), so what it runs is unchanged. On several workers (pytest-xdist)
every worker collects every test, so only the first starts the training, and the others
wait for it while its process lives (its pid is in the cache directory)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loraserve.testing.plugins.figures import add_figure

# The modules that use the demo (`demo_trained`).
DEMO_TESTS = frozenset({"test_run_command.py", "test_demo_model.py"})
# Longer than the training on a busy 2-core machine.
TRAIN_TIMEOUT_S = 1200.0
_PID_FILE = "warmup-train.pid"

_trainer = pytest.StashKey[tuple[subprocess.Popen[bytes], Path]]()
_started_at = pytest.StashKey[float]()
# The figure (loraserve.testing.plugins.figures) CI's summary gives the training's time by.
TRAINING_FIGURE = "seconds the demo's training took, in the background"


def demo_cache_dir(config: pytest.Config) -> Path:
    """Where the run command, and this warm-up, keep the demo."""
    return config.rootpath / ".cache" / "demo"


def pytest_collection_finish(session: pytest.Session) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    if not any(item.path.name in DEMO_TESTS for item in session.items):
        return
    # Here, not at the top: torch's import is seconds every other session need not pay.
    from loraserve.tiny.demo_model import is_demo_built

    cache_dir = demo_cache_dir(session.config)
    if is_demo_built(cache_dir):
        return
    cache_dir.mkdir(parents=True, exist_ok=True)
    log_path = cache_dir / "warmup-train.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "loraserve.tiny", "demo", str(cache_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    (cache_dir / _PID_FILE).write_text(str(process.pid))
    session.config.stash[_trainer] = (process, log_path)
    session.config.stash[_started_at] = time.time()


# First: the figures plugin hands this worker's figures to the controller at its own.
@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    started = session.config.stash.get(_trainer, None)
    if started is None:
        return
    process, log_path = started
    if process.poll() is None:
        process.kill()
        process.wait()
    elif process.returncode == 0:
        # The log's last write is the training's end.
        took = log_path.stat().st_mtime - session.config.stash[_started_at]
        add_figure(session.config, TRAINING_FIGURE, round(took))
    # A pid left behind could name an unrelated process by the next session, whose
    # workers would then wait on it.
    (demo_cache_dir(session.config) / _PID_FILE).unlink(missing_ok=True)


@pytest.fixture(scope="session")
def demo_trained(pytestconfig: pytest.Config) -> Path:
    """The demo cache directory, once the warm-up's training (if it started one) ended."""
    started = pytestconfig.stash.get(_trainer, None)
    if started is not None:
        process, log_path = started
        try:
            code = process.wait(TRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"training the demo took over {TRAIN_TIMEOUT_S:.0f} s; see {log_path}")
        if code != 0:
            tail = log_path.read_text("utf-8", "replace")[-2000:]
            pytest.fail(f"training the demo failed (exit status {code}):\n{tail}")
    else:
        _wait_for_another_workers_training(demo_cache_dir(pytestconfig))
    return demo_cache_dir(pytestconfig)


def _wait_for_another_workers_training(cache_dir: Path) -> None:
    """Waits while a training another worker started still runs; the run command's own
    check then finds the demo built, or builds it if that training failed."""
    from loraserve.tiny.demo_model import is_demo_built

    deadline = time.monotonic() + TRAIN_TIMEOUT_S
    while (
        not is_demo_built(cache_dir)
        and _running(cache_dir / _PID_FILE)
        and time.monotonic() < deadline
    ):
        time.sleep(1.0)


def _running(pid_file: Path) -> bool:
    """Whether the process whose pid `pid_file` holds still runs (not exited, not a zombie)."""
    try:
        stat = Path(f"/proc/{int(pid_file.read_text())}/stat").read_text()
    except (OSError, ValueError):
        return False
    # The state follows the command name, which is in parentheses and may hold spaces.
    return stat.rpartition(")")[2].split()[0] != "Z"
