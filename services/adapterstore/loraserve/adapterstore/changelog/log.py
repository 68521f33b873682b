"""The change log: commits, catching up with other replicas, following, freshness.

Invariants (the story, and what each costs: docs/design.md, "Adapter store"):
- every seq is written once, with a conditional put; a lost race re-reads the log
  and retries with the next seq, and one process never races itself (a lock);
- an ambiguous put is read back: the entry's commit id says whether it happened;
- a change made for an idempotency key is made once, however often it is retried;
- `state` is the latest snapshot folded with every entry after it, up to the head
  last read; `synced_time` is when a catch-up last read up to the head, and the
  poller never stops on an error;
- a commit reads a bounded number of objects whatever the store holds; snapshots
  and pruning run in the background. Storage layout and retention: logstorage.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from loraserve.adapterstore.blobs import BlobNotFound, BlobStore, check_conditional_put
from loraserve.adapterstore.catalog import Change, RequestRecord, StoreState, now
from loraserve.adapterstore.changelog.incarnation import current_incarnation, ensure_incarnation
from loraserve.adapterstore.changelog.logstorage import is_gap, log_key, parse_change, read_entries
from loraserve.adapterstore.changelog.logtypes import ChangeBuilder, RequestTag, conflict_backoff
from loraserve.adapterstore.changelog.logtypes import LogSettings as LogSettings
from loraserve.adapterstore.changelog.snapshots import SnapshotWriter, latest_snapshot
from loraserve.adapterstore.compat.formats import OLDEST_FORMAT, UnsupportedFormat
from loraserve.common.errors import (
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    OutOfRange,
    Unavailable,
)
from loraserve.common.rpc.backoff import Backoff
from loraserve.common.tracing import bounded_traceparent, child_span, current_traceparent, tracer

log = logging.getLogger(__name__)
_TRACER = tracer(__name__)

# A lost commit race is retried this often before the caller is told to retry later.
_MAX_COMMIT_ATTEMPTS = 64
# Every this many polls, a poll that found nothing also looks for a gap left by retention.
_GAP_CHECK_EVERY = 25
_READ_BATCH = 256
# Longest pause between polls while storage keeps failing.
_MAX_POLL_BACKOFF_S = 10.0


class ChangeLog:
    def __init__(
        self,
        blobs: BlobStore,
        settings: LogSettings,
        storage_format: Callable[[], int] = lambda: OLDEST_FORMAT,
    ) -> None:
        """`storage_format` says, at each snapshot, the newest format every store on
        the bucket reads (compat/gate.py)."""
        self._blobs = blobs
        self._settings = settings
        self._state = StoreState()
        self._incarnation = ""
        self._events: deque[Change] = deque(maxlen=settings.memory_events)
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self._synced_at = time.monotonic()
        self._synced_time = now()
        self._snapshots = SnapshotWriter(
            blobs, settings.log_retention, lambda: self._state, storage_format
        )
        # The format of the snapshot last loaded (0: none).
        self._snapshot_format = 0

    @property
    def state(self) -> StoreState:
        """The folded state; callers read it and never change it."""
        return self._state

    @property
    def head_seq(self) -> int:
        return self._state.seq

    @property
    def incarnation(self) -> str:
        """The bucket's incarnation id (see incarnation.py); "" before `start`."""
        return self._incarnation

    @property
    def synced_time(self) -> datetime:
        """When `state` was last confirmed to hold every entry in storage."""
        return self._synced_time

    @property
    def staleness_s(self) -> float:
        """Seconds since `synced_time`; growing without bound once the poller is gone."""
        return time.monotonic() - self._synced_at

    @property
    def following(self) -> bool:
        """Whether the poller runs (it stops only when the log is closed)."""
        return self._poller is not None and not self._poller.done()

    async def start(self) -> None:
        """Checks that storage honours conditional puts, loads the latest snapshot and
        the log after it, then follows the log."""
        await check_conditional_put(self._blobs)
        async with self._lock:
            self._incarnation = await ensure_incarnation(self._blobs)
            await self._load_snapshot()
            await self._catch_up(check_gaps=True)
        log.info(
            "log.loaded seq=%d adapters=%d incarnation=%s",
            self._state.seq,
            len(self._state.adapters),
            self._incarnation,
        )
        self._poller = asyncio.create_task(self._poll_forever(), name="changelog-poller")

    def write_older_snapshot(self, storage_format: int) -> bool:
        """When the snapshot loaded is in a format newer than `storage_format`, writes
        the state again now, in the format the store may write: the newest snapshot is
        then one a release that reads only `storage_format` starts from (a downgrade,
        docs/compatibility.md). True if one was asked for."""
        if self._snapshot_format <= storage_format:
            return False
        log.info(
            "log.snapshot_rewrite seq=%d from_format=%d to_format=%d",
            self._state.seq,
            self._snapshot_format,
            storage_format,
        )
        self._snapshots.request(replace=True)
        return True

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        self._poller = None
        await self._snapshots.close()

    async def commit(
        self, build: ChangeBuilder, request: RequestTag | None = None
    ) -> Change | None:
        """Commits the change `build` makes from the freshest state, retrying on lost races.
        When it returns, `state` includes the change and nothing after it. With
        `request`, a key committed before returns the change it made, unless it came
        with a different request (InvalidArgument). The change records the caller's
        trace (`trace_parent`): what watchers do about it joins that trace."""
        trace_parent = bounded_traceparent(current_traceparent())
        with child_span(_TRACER, "loraserve.store.commit") as span:
            change = await self._commit(build, request, trace_parent)
            if change is not None and span.is_recording():
                span.set_attribute("loraserve.seq", change.seq)
            return change

    async def _commit(
        self, build: ChangeBuilder, request: RequestTag | None, trace_parent: str
    ) -> Change | None:
        backoff = conflict_backoff()
        async with self._lock:
            for _ in range(_MAX_COMMIT_ATTEMPTS):
                await self._catch_up(check_gaps=True)
                if request is not None and (done := self._state.requests.get(request.key)):
                    return await self._replay(request, done)
                seq = self._state.seq + 1
                change = build(self._state, seq)
                if change is None:
                    return None
                change = replace(
                    change,
                    commit_id=uuid.uuid4().hex,
                    request_key=request.key if request else "",
                    request_digest=request.digest if request else "",
                    trace_parent=trace_parent,
                )
                data = json.dumps(change.to_json(), separators=(",", ":")).encode()
                if await self._write_entry(seq, data, change.commit_id):
                    self._apply(change)
                    log.info(
                        "log.committed seq=%d type=%s adapter=%s",
                        seq,
                        change.type.value,
                        change.adapter_name,
                    )
                    if seq % self._settings.snapshot_every == 0:
                        self._snapshots.request()
                    return change
                delay = backoff.next_delay()
                log.info("log.commit_conflict seq=%d retry_in_s=%.3f", seq, delay)
                await asyncio.sleep(delay)
        raise Unavailable(f"commit lost {_MAX_COMMIT_ATTEMPTS} races in a row; retry later")

    async def _write_entry(self, seq: int, data: bytes, commit_id: str) -> bool:
        """Puts the entry at `seq` if the key is free; True if the entry there is ours.
        A 412 is ambiguous: the SDK retries a put whose reply was lost, and the retry
        is refused because of our own first attempt. A put that failed after its
        retries may have landed too. Both are settled by reading the entry back."""
        key = log_key(seq)
        failure: Unavailable | None = None
        try:
            if await self._blobs.put_if_absent(key, data):
                return True
        except Unavailable as e:
            failure = e
        try:
            stored = parse_change(await self._blobs.get(key), seq)
        except BlobNotFound:
            if failure is not None:
                raise failure from None
            return False
        if stored.commit_id == commit_id:
            log.warning("log.commit_confirmed_by_read_back seq=%d", seq)
            return True
        # Another writer's entry: fold it now instead of reading it again.
        self._apply(stored)
        return False

    async def committed(self, request: RequestTag | None) -> Change | None:
        """The change `request`'s key already made, as `commit` would answer it
        (InvalidArgument when the key came with another request); None when the key
        is new here (or there is none), or when storage cannot be read now (`commit`
        checks again)."""
        if request is None or not await self.sync():
            return None
        record = self._state.requests.get(request.key)
        return None if record is None else await self._replay(request, record)

    async def _replay(self, request: RequestTag, record: RequestRecord) -> Change:
        if record.digest != request.digest:
            raise InvalidArgument(
                f"idempotency key {request.key!r} was already used at seq {record.seq} "
                "for a different request; use a new key for a new request"
            )
        change = await self._change_at(record.seq)
        if change is None:
            raise FailedPrecondition(
                f"idempotency key {request.key!r} was committed at seq {record.seq}, "
                "whose log entry is no longer kept"
            )
        log.info("log.request_replayed key=%s seq=%d", request.key, record.seq)
        return change

    async def _change_at(self, seq: int) -> Change | None:
        """The committed change at `seq`, from memory or the log; None when pruned."""
        if self._events and self._events[0].seq <= seq <= self._events[-1].seq:
            return self._events[seq - self._events[0].seq]
        try:
            return (await read_entries(self._blobs, seq, seq))[0]
        except OutOfRange:
            return None

    async def sync(self) -> bool:
        """Catches up with commits of other replicas, so a read after a write made
        through another replica sees it; False if storage could not be read, and
        reads go on from the state as it is."""
        try:
            async with self._lock:
                await self._catch_up(check_gaps=False)
        except Unavailable:
            log.warning("log.sync_failed seq=%d: answering from local state", self._state.seq)
            return False
        return True

    async def events_after(self, after_seq: int) -> list[Change]:
        """The next committed changes after `after_seq`, in order (empty when there are
        none yet); raises OutOfRange when retention has deleted some of them."""
        first = after_seq + 1
        head = self._state.seq
        if first > head:
            return []
        if self._events and first >= self._events[0].seq:
            start = first - self._events[0].seq
            return list(itertools.islice(self._events, start, start + _READ_BATCH))
        return await read_entries(self._blobs, first, min(head, first + _READ_BATCH - 1))

    async def wait_for_change(self, after_seq: int, timeout: float) -> bool:
        """Waits until the head passes `after_seq` or the incarnation changes; False if
        `timeout` seconds pass first."""
        incarnation = self._incarnation
        while self._state.seq <= after_seq and self._incarnation == incarnation:
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), timeout)
            except TimeoutError:
                return self._state.seq > after_seq or self._incarnation != incarnation
        return True

    def _apply(self, change: Change) -> None:
        self._state.apply(change)
        self._events.append(change)
        self._wake()

    def _wake(self) -> None:
        """Wakes everyone waiting for a change."""
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _catch_up(self, *, check_gaps: bool) -> None:
        """Applies every committed entry after `state.seq`. Holds the lock."""
        while True:
            key = log_key(self._state.seq + 1)
            try:
                data = await self._blobs.get(key)
            except BlobNotFound:
                if not check_gaps or not await is_gap(self._blobs, self._state.seq):
                    self._synced_at, self._synced_time = time.monotonic(), now()
                    return
                log.warning("log.gap seq=%d: reloading the latest snapshot", self._state.seq + 1)
                if not await self._load_snapshot():
                    raise DataLoss(
                        f"log entry {self._state.seq + 1} is missing and no snapshot covers it"
                    ) from None
                continue
            self._apply(parse_change(data, self._state.seq + 1))

    async def _check_incarnation(self) -> None:
        """Starts over from the bucket's state when its incarnation is not the one
        this replica loaded (see incarnation.py). Holds the lock."""
        incarnation = await current_incarnation(self._blobs, self._incarnation)
        if incarnation == self._incarnation:
            return
        log.warning(
            "log.incarnation_changed old=%s new=%s old_seq=%d: reloading from storage",
            self._incarnation,
            incarnation,
            self._state.seq,
        )
        self._incarnation, self._state = incarnation, StoreState()
        self._events.clear()
        await self._load_snapshot()
        self._wake()  # watchers find the incarnation changed (see watching.py)

    async def _load_snapshot(self) -> bool:
        """Replaces the state with the latest snapshot if it is ahead; True if it was."""
        found = await latest_snapshot(self._blobs)
        if found is None or found[0].seq <= self._state.seq:
            return False
        self._state, self._snapshot_format = found
        # The in-memory history must stay contiguous with the state.
        self._events.clear()
        self._wake()
        log.info("log.snapshot_loaded seq=%d format=%d", self._state.seq, self._snapshot_format)
        return True

    async def _poll_forever(self) -> None:
        # Nothing but cancellation may end the poller: watchers depend on it, and a
        # poller that died would leave this replica answering from an old seq.
        backoff = Backoff(self._settings.poll_interval, _MAX_POLL_BACKOFF_S)
        delay = self._settings.poll_interval
        for polls in itertools.count(1):
            await asyncio.sleep(delay)
            try:
                async with self._lock:
                    check_gaps = polls % _GAP_CHECK_EVERY == 0
                    if check_gaps:
                        await self._check_incarnation()
                    await self._catch_up(check_gaps=check_gaps)
            except (Unavailable, DataLoss, UnsupportedFormat) as e:
                # A newer store's object is waited out like a storage fault: this
                # replica goes stale (NOT_SERVING) and says why, never misreads it.
                delay = backoff.next_delay()
                log.warning(
                    "log.poll_failed seq=%d stale_s=%.1f retry_in_s=%.2f error=%s",
                    self._state.seq,
                    self.staleness_s,
                    delay,
                    e.message,
                )
            except Exception:
                delay = backoff.next_delay()
                log.exception(
                    "log.poll_bug seq=%d stale_s=%.1f retry_in_s=%.2f",
                    self._state.seq,
                    self.staleness_s,
                    delay,
                )
            else:
                backoff.reset()
                delay = self._settings.poll_interval
