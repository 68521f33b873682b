"""A one-line progress bar on stderr for long hashes and uploads."""

from __future__ import annotations

import threading
import time
from typing import TextIO

from loraserve.adapterctl.terminal.output import format_size

# Below this a push takes well under a second on any link worth using: no bar.
MIN_BYTES_FOR_BAR = 16 * 1024 * 1024
_REDRAW_INTERVAL_S = 0.1
_BAR_WIDTH = 30


class Progress:
    """Counts bytes and redraws `label [#####.....] 45% 120.0 MiB/268.4 MiB 60.1 MiB/s`.

    Disabled, it only counts: callers need not care whether stderr is a terminal.
    `advance` may be called from a worker thread (hashing runs in one).
    """

    def __init__(self, stream: TextIO, label: str, total: int, enabled: bool) -> None:
        self._stream = stream
        self._label = label
        self._total = max(total, 1)
        self._enabled = enabled
        self._done = 0
        self._started = time.monotonic()
        self._drawn_at = 0.0
        self._lock = threading.Lock()

    def advance(self, count: int) -> None:
        with self._lock:
            self._done += count
            now = time.monotonic()
            if self._enabled and now - self._drawn_at >= _REDRAW_INTERVAL_S:
                self._drawn_at = now
                self._draw(now)

    def finish(self) -> None:
        """Erases the bar so the next line starts clean."""
        if self._enabled:
            self._stream.write("\r\x1b[K")
            self._stream.flush()

    def _draw(self, now: float) -> None:
        fraction = min(self._done / self._total, 1.0)
        filled = int(fraction * _BAR_WIDTH)
        rate = self._done / max(now - self._started, 1e-6)
        self._stream.write(
            f"\r\x1b[K{self._label} [{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] "
            f"{fraction:4.0%} {format_size(self._done)}/{format_size(self._total)} "
            f"{format_size(int(rate))}/s"
        )
        self._stream.flush()
