"""Delivering this replica's reports to the store about each adapter it serves.

What is kept is `state.ReportBook`: a report that could not be sent for a
transient reason is sent again on `resend_unsent`, and while `keep_alive` runs, a
store that had let this replica's statuses expire gets every adapter's latest ACK
or NACK again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from loraserve.clients.store import Report
from loraserve.common import errors
from loraserve.common.errors import TRANSIENT_ERRORS
from loraserve.inference.sync.state import ReportBook

log = logging.getLogger(__name__)


class StatusAPI(Protocol):
    """The store's calls for statuses (`StoreClient`, or a fake)."""

    async def report(self, report: Report) -> None: ...

    async def alive(self) -> bool: ...


class StatusReporter:
    def __init__(self, store: StatusAPI, book: ReportBook, interval_s: float) -> None:
        self._store = store
        self._book = book
        self._interval_s = interval_s

    async def keep_alive(self) -> None:
        """Signs of life keep this replica's statuses shown in the store; when the
        store had let them expire, every adapter's latest report goes again."""
        while True:
            try:
                known = await self._store.alive()
                if not known:
                    for report in list(self._book.latest.values()):
                        await self.report(report)
            except errors.LoraserveError as exc:
                log.warning("sync.alive_failed reason=%s", exc)
            except Exception:
                # A bug here must not silently end the signs of life.
                log.exception("sync.alive_bug")
            await asyncio.sleep(self._interval_s)

    async def report(self, report: Report) -> None:
        self._book.record(report)
        try:
            await self._store.report(report)
        except TRANSIENT_ERRORS as exc:
            # The store keeps one status per replica and adapter: the latest report
            # is all that needs to reach it, once it is back.
            log.warning(
                "sync.report_deferred name=%s rev=%d type=%s reason=%s",
                report.name,
                report.revision,
                report.kind.name,
                exc,
            )
            self._book.deferred(report)
        except errors.LoraserveError as exc:
            log.error(
                "sync.report_refused name=%s rev=%d type=%s reason=%s",
                report.name,
                report.revision,
                report.kind.name,
                exc,
            )
            self._book.done(report)
        else:
            self._book.done(report)

    async def resend_unsent(self) -> None:
        for report in list(self._book.unsent.values()):
            if self._book.unsent.get(report.name) is report:
                await self.report(report)
