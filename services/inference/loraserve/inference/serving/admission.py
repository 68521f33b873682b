"""Bounded admission: a fixed number of requests in the server at once, the rest refused.

Refusing at the door (RESOURCE_EXHAUSTED, which clients retry elsewhere or later)
keeps memory bounded; queueing without a bound would only move the overload into
this process.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from loraserve.common.errors import ResourceExhausted


class Admission:
    """Counts admitted requests against `max_pending`."""

    def __init__(self, max_pending: int) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        self._max_pending = max_pending
        self._pending = 0

    @property
    def max_pending(self) -> int:
        return self._max_pending

    @property
    def pending(self) -> int:
        return self._pending

    @contextmanager
    def admit(self) -> Iterator[None]:
        """Holds one admission slot; raises ResourceExhausted when none is free."""
        if self._pending >= self._max_pending:
            raise ResourceExhausted(
                f"server is at its limit of {self._max_pending} pending requests; retry later"
            )
        self._pending += 1
        try:
            yield
        finally:
            self._pending -= 1
