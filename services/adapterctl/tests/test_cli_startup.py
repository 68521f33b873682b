"""adapterctl's start-up is part of every push's latency: what a push imports."""

from __future__ import annotations

import os
import subprocess
import sys

# Loaded only by the commands that need them (push --watch, generate, status).
_NOT_FOR_PUSH = ("watchdog", "loraserve.inference", "google.protobuf.json_format")


def test_push_loads_neither_watchdog_nor_inference_protos() -> None:
    code = (
        "import sys\n"
        "import loraserve.adapterctl.cli\n"
        "import loraserve.adapterctl.commands.write\n"
        f"print(sorted(m for m in sys.modules if m.startswith({_NOT_FOR_PUSH!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
