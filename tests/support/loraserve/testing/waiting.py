"""Waiting in tests for a condition to hold: poll it, under a guard that only stops a hung
test. Nothing here measures time; a loaded machine only makes the wait longer."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

# Guards, by what a test waits for; each only stops a hung test, so a longer one costs a
# passing test nothing.
# A server's answer or reaction.
GUARD_S = 60.0
# A process that starts, restarts or stops, with its engine.
PROCESS_GUARD_S = 120.0
# Several engines starting or loading at once on two loaded cores (a fleet, a rollout
# of replicas).
FLEET_GUARD_S = 600.0
POLL_S = 0.02


async def eventually(
    check: Callable[[], bool] | Callable[[], Awaitable[bool]], what: str, guard_s: float = GUARD_S
) -> None:
    """Waits until `check()` (a plain or an async callable) holds; fails naming `what` if it
    does not within `guard_s`."""
    try:
        async with asyncio.timeout(guard_s):
            while True:
                held = check()
                if inspect.isawaitable(held):
                    held = await held
                if held:
                    log.info("test.observed %s", what)
                    return
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"never happened: {what}") from None
