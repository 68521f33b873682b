"""A private network namespace in which this host has a non-loopback address: 192.0.2.1
(TEST-NET-1) on the namespace's own loopback interface. A server there sees a client
that connects to 192.0.2.1 as that address, yet no packet leaves the namespace. It is
made in a user namespace, so it needs no root; where the kernel or the sandbox forbids
one, the tests that need it are skipped, saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

REMOTE = "192.0.2.1"
_ENTER = ["unshare", "--net", "--map-root-user"]
_SETUP = f'ip link set lo up && ip addr add {REMOTE}/32 dev lo && exec "$@"'


def _unusable() -> str:
    """Why no such namespace can be made here; "" where it can."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2)"
    try:
        made = subprocess.run(
            [*_ENTER, "bash", "-c", _SETUP, "netns", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot make a private network namespace: {exc}"
    if made.returncode != 0:
        return f"cannot make a private network namespace: {made.stderr.strip()}"
    return ""


UNUSABLE = _unusable()

netns_only = pytest.mark.skipif(bool(UNUSABLE), reason=UNUSABLE)


def run_in_netns(
    argv: Sequence[str], timeout_s: float = 120.0, env: Mapping[str, str] | None = None
) -> Any:
    """Runs `argv` in a fresh namespace, with `env` added to the environment; the JSON its
    last line of output holds."""
    done = subprocess.run(
        [*_ENTER, "bash", "-c", _SETUP, "netns", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise AssertionError(f"{argv} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
