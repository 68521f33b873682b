"""The run command fails loudly and cleanly: a server that cannot start ends the run
with a message naming it and a non-zero status, and nothing is left running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)


def test_a_server_that_exits_stops_the_run_with_its_last_lines(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "loraserve.demo",
            "--model=/nonexistent/model",
            "--store-port=0",
            "--inference-port=0",
            f"--state-dir={tmp_path}",
            # Below S3's minimum part size: the store refuses to start.
            "--store-arg=--part-size=1",
        ],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: adapterstore exited with status 2" in result.stdout
    assert "part-size" in result.stdout
    assert result.stdout.rstrip().endswith("stopped.")


def test_bad_flags_exit_with_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "loraserve.demo", "--model=/m", "--demo-adapters"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--demo-adapters needs the demo model" in result.stderr
