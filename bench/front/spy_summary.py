"""A py-spy raw (collapsed-stack) profile of a server, summed by frame: where the event
loop's busy time goes (`python -m bench.front.stream_probe summarize FILE`)."""

from __future__ import annotations

import collections
import re
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>[^ ]+) \((?P<file>[^:]+)(?::\d+)?\)$")


# Where the event loop waits for work: a sample ending here is idle, not CPU (the last
# two in a profile with native frames, where uvloop waits in libuv).
_IDLE_LEAVES = (
    "select (selectors.py)",
    "poll (selectors.py)",
    "epoll_wait (libc.so.6)",
    "epoll_pwait (libc.so.6)",
)


def summarize(path: Path, top: int = 25) -> str:
    """A py-spy raw (collapsed) profile of a server: the event-loop thread's busy samples
    (those under asyncio.Runner.run, not waiting in select) by frame, self and inclusive.
    Without --native, time in C and Cython (grpc's core, upb) counts as the self time of
    the nearest Python frame: grpc's completions run under asyncio's Handle._run (or
    Runner.run with uvloop), and a `context.write` counts to the frame awaiting it."""
    self_n: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    busy = total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_short(f) for f in stack.split(";") if f]
        total += int(count)
        if not any(f.startswith("Runner.run ") for f in frames):
            continue
        if frames[-1].endswith(_IDLE_LEAVES):
            continue
        busy += int(count)
        self_n[frames[-1]] += int(count)
        for frame in set(frames):
            incl[frame] += int(count)
    rows = [f"{total} samples, {busy} of them the event loop busy"]
    rows += [f"self {n / busy:6.1%}  {frame}" for frame, n in self_n.most_common(top)]
    rows += [f"incl {n / busy:6.1%}  {frame}" for frame, n in incl.most_common(top)]
    return "\n".join(rows)


def _short(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    file = match["file"]
    for marker in ("site-packages/", "loraserve/", "python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{match['func']} ({file})"
