"""One adapter's sync worker: applies the adapter's latest wish, retrying transient
failures on the sync schedule; a newer wish cuts a retry's wait short."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import stamina

from loraserve.common.errors import TRANSIENT_ERRORS

log = logging.getLogger(__name__)

RetryHook = Callable[[BaseException], bool]
"""Whether to retry after this failure (stamina's `on`); logs it."""


class AdapterWorker:
    """One adapter's worker: applies its latest wish, retrying transient failures.
    A newer wish cuts a backoff wait short: it may not need what failed."""

    task: asyncio.Task[None]

    def __init__(self, name: str) -> None:
        self.name = name
        # A newer wish came since this attempt began.
        self._woken = False
        # Set only while a retry waits: ending it early starts the newer wish.
        self._waiting: asyncio.Timeout | None = None
        self._scope: asyncio.Timeout | None = None

    def wake(self) -> None:
        self._woken = True
        if self._waiting is not None:
            self._waiting.reschedule(asyncio.get_running_loop().time())
            self._waiting = None

    async def apply(
        self,
        apply: Callable[[], Awaitable[None]],
        retrying: Callable[[RetryHook], AsyncIterator[stamina.Attempt]],
    ) -> bool:
        """True once `apply` succeeded; False when a newer wish ended the retries."""
        self._woken = False
        scope = asyncio.timeout(None)
        try:
            async with scope:
                self._scope = scope
                async for attempt in retrying(self._retry_on):
                    with attempt:
                        self._waiting = None
                        scope.reschedule(None)
                        await apply()
            return True
        except TRANSIENT_ERRORS:
            return False  # not retried: a newer wish came during the attempt
        except TimeoutError:
            if not scope.expired():
                raise
            return False  # woken while waiting to retry
        finally:
            self._scope = self._waiting = None

    def _retry_on(self, exc: BaseException) -> bool:
        if not isinstance(exc, TRANSIENT_ERRORS) or self._woken:
            return False
        log.warning("sync.apply_retry name=%s reason=%s", self.name, exc)
        self._waiting = self._scope
        return True
