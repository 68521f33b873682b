"""Another process's CPU time is read finer than /proc's clock ticks."""

from __future__ import annotations

import subprocess
import sys

from bench.method.cpu import cpu_seconds

_BURN_5_MS = """
import sys, time
while time.process_time() < 0.005:
    pass
print(time.process_time(), flush=True)
sys.stdin.read()
"""


def test_another_process_cpu_time_is_read_below_a_clock_tick() -> None:
    # /proc/PID/stat counts whole 10 ms ticks; a process that ran less reads short.
    child = subprocess.Popen(
        [sys.executable, "-S", "-c", _BURN_5_MS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ran = float(child.stdout.readline())
        assert cpu_seconds(child.pid) >= ran
    finally:
        child.communicate("")
