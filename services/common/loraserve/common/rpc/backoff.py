"""Exponential backoff with jitter for reconnects and retries."""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter: half fixed, half random, so replicas that
    lost the store together do not come back in lockstep."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._attempt = 0

    def next_delay(self) -> float:
        ceiling = min(self._maximum, self._initial * 2.0**self._attempt)
        self._attempt += 1
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def reset(self) -> None:
        self._attempt = 0
