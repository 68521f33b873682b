"""Ctrl-C while adapterctl is still importing exits 130 without a traceback (issue 29,
item 17). The SIGINT is sent from inside the process the moment it starts importing
grpc, so it lands during the imports every time."""

from __future__ import annotations

import os
import subprocess
import sys

# Runs adapterctl as `python -m loraserve.adapterctl` does, with an import hook that
# interrupts the process as grpc's import begins.
_INTERRUPTED_WHILE_IMPORTING = """
import os, runpy, signal, sys

class InterruptOnGrpc:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, InterruptOnGrpc())
sys.argv = ["adapterctl", "list", "--store", "127.0.0.1:1"]
runpy.run_module("loraserve.adapterctl", run_name="__main__")
"""


def test_ctrl_c_while_importing_exits_130_quietly() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_WHILE_IMPORTING],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (130, "")
