"""The abuse suite at full size, run by `make abuse` (LORASERVE_ABUSE=long) and collected
by no other run: each attack of issue 53's list at its full count against a server in a
process of its own, with a normal client's p99 before, during and after and the server's
peak RSS reported (`reliability figures`) and held to the issue's bounds. CI runs the
short variant of each: tests/reliability/test_abuse_*.py."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("LORASERVE_ABUSE") == "long" else ["test_*.py"]
