"""Watch streams: every change after a seq, in order, with heartbeats.

A watch follows one incarnation of the store (see incarnation.py). Its position
is a seq of that incarnation, so a position past the head, a client's
incarnation other than the store's, or the incarnation changing under an open
watch is OUT_OF_RANGE: the client lists again, which is the only way to learn
what the store holds now.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

from opentelemetry.trace import INVALID_SPAN, Span, SpanKind

from loraserve.adapterstore.catalog import Change, now
from loraserve.adapterstore.changelog.log import ChangeLog
from loraserve.common.errors import InvalidArgument, OutOfRange, Unavailable
from loraserve.common.tracing import context_from_traceparent, tracer

_TRACER = tracer(__name__)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    seq: int
    time: datetime
    synced_time: datetime  # when `seq` was last confirmed against storage
    incarnation: str  # the store's incarnation `seq` counts in


class Watches:
    """The watch streams of one store replica."""

    def __init__(self, changelog: ChangeLog, heartbeat_interval: float) -> None:
        self._log = changelog
        self._heartbeat_interval = heartbeat_interval
        self._stopping = asyncio.Event()
        # Watch streams open now.
        self.count = 0

    def stop(self) -> None:
        """Ends every watch stream with UNAVAILABLE, now and from now on."""
        self._stopping.set()

    async def watch(
        self, after_seq: int, incarnation: str = ""
    ) -> AsyncIterator[Change | Heartbeat]:
        """Every change after `after_seq` in order, and a heartbeat after each quiet
        `heartbeat_interval`; ends only with the caller, with OutOfRange, or with
        Unavailable once `stop_watches` is called.

        `after_seq` past the head, or an `incarnation` other than the store's, is
        OutOfRange: the caller's seq counts in another incarnation of the store (its
        bucket was emptied and started afresh), and only a listing can tell it what
        the store holds now. The same goes when the incarnation changes while the
        watch is open."""
        if after_seq < 0:
            raise InvalidArgument(f"after_seq must not be negative, got {after_seq}")
        incarnation = incarnation or self._log.incarnation
        await self._check_watch_position(after_seq, incarnation)
        position = after_seq
        self.count += 1
        try:
            while True:
                self._check_not_stopping()
                self._check_incarnation(incarnation)
                changes = await self._log.events_after(position)
                for change in changes:
                    span = _event_span(change)
                    try:
                        yield change
                    finally:
                        span.end()
                    position = change.seq
                if changes:
                    continue
                if not await self._wait_for_change(position):
                    yield Heartbeat(
                        self._log.head_seq, now(), self._log.synced_time, self._log.incarnation
                    )
        finally:
            self.count -= 1

    async def _check_watch_position(self, after_seq: int, incarnation: str) -> None:
        self._check_incarnation(incarnation)
        if after_seq <= self._log.head_seq:
            return
        # Behind other store replicas, perhaps: only the log's head in storage can
        # tell a seq not seen yet from one that never was.
        if not await self._log.sync():
            raise Unavailable(
                f"this store replica is at seq {self._log.head_seq}, behind the watch's after_seq "
                f"{after_seq}, and cannot read the log now; watch again"
            )
        self._check_incarnation(incarnation)
        if after_seq > self._log.head_seq:
            raise OutOfRange(
                f"after_seq {after_seq} is beyond the store's last commit {self._log.head_seq} "
                f"(store incarnation {self._log.incarnation}): the seq comes from another "
                "incarnation of the store; list adapters and watch from the listing's seq"
            )

    def _check_incarnation(self, incarnation: str) -> None:
        if incarnation != self._log.incarnation:
            raise OutOfRange(
                f"the watch follows store incarnation {incarnation}, but the store is "
                f"incarnation {self._log.incarnation} now (its bucket was started afresh); "
                "list adapters and watch from the listing's seq"
            )

    async def _wait_for_change(self, after_seq: int) -> bool:
        """ChangeLog.wait_for_change for one heartbeat interval, cut short by
        `stop_watches`."""
        changed = asyncio.ensure_future(
            self._log.wait_for_change(after_seq, self._heartbeat_interval)
        )
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({changed, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in (changed, stopping):
                waiter.cancel()
            await asyncio.gather(changed, stopping, return_exceptions=True)
        self._check_not_stopping()
        return changed.result()

    def _check_not_stopping(self) -> None:
        if self._stopping.is_set():
            raise Unavailable("the adapter store is shutting down; watch again")


def _event_span(change: Change) -> Span:
    """`loraserve.store.event`: one watch stream sending `change`, in the trace of the
    request that made it (none for an untraced change); it ends once the stream has
    taken the event."""
    if not change.trace_parent:
        return INVALID_SPAN
    span = _TRACER.start_span(
        "loraserve.store.event",
        context=context_from_traceparent(change.trace_parent),
        kind=SpanKind.PRODUCER,
    )
    if span.is_recording():
        span.set_attributes(
            {
                "loraserve.adapter": change.adapter_name,
                "loraserve.seq": change.seq,
                "loraserve.change": change.type.value,
                "loraserve.revision": change.revision.revision if change.revision else 0,
            }
        )
    return span
