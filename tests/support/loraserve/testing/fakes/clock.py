"""A clock a test moves by hand: what the code under test reads as `time.monotonic` or
`time.time` (any zero-argument callable returning seconds) stands still until the test
sets or advances `now`."""

from __future__ import annotations


class ManualClock:
    """Seconds as the test sets them (`now`); call it for the time."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def time(self) -> float:
        """For code that calls `time.time()` on a module the test replaced with this."""
        return self.now
