"""adapterctl's start-up is part of every push's latency: what a push imports."""

from __future__ import annotations

import os
import subprocess
import sys

# Loaded only by the commands that need them (push --watch, generate, status), or by
# none: boto3 and botocore (the store's S3 client, about 150 ms to import), the store's
# own modules beyond its generated contract, and cryptography (a server's TLS files,
# a signed push: 25 ms of about 130 ms of imports).
_NOT_FOR_PUSH = (
    "watchdog",
    "loraserve.inference",
    "google.protobuf.json_format",
    "boto3",
    "botocore",
    "loraserve.adapterstore.blobs",
    "loraserve.adapterstore.files",
    "cryptography",
)


def test_push_loads_neither_watchdog_nor_inference_protos_nor_the_s3_client() -> None:
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
