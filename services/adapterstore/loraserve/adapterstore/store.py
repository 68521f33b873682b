"""The adapter store's operations, independent of gRPC.

Reads answer from the state folded from the log; writes build a Change from the
freshest state and commit it through the ChangeLog. Revisions are immutable and
their numbers keep increasing across a delete, so NAME@N never names two
different contents.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from loraserve.adapterstore.blobs import BlobStore
from loraserve.adapterstore.catalog import (
    Adapter,
    AdapterPage,
    Change,
    RevisionPage,
    YankMark,
    adapter_page,
    detached,
    find_adapter,
    find_revision,
    now,
    pagetokens,
    revision_page,
)
from loraserve.adapterstore.changelog import (
    ChangeLog,
    Heartbeat,
    Watches,
    adapter_deleted,
    check_idempotency_key,
    current_set,
    push_request_tag,
    request_tag,
    revision_pushed,
)
from loraserve.adapterstore.files import (
    Chunk,
    HashOnlyUploads,
    Limits,
    PushHeader,
    PushResult,
    check_declared_files,
    keep_files,
    read_verified,
    receive_adapter,
)
from loraserve.adapterstore.quotas import QuotaOps
from loraserve.adapterstore.replicas.ops import ReplicaOps
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.adapterstore.rollout.guard import RolloutGuard
from loraserve.adapterstore.rollout.ops import RolloutOps
from loraserve.adapterstore.signature_policy import ServedRevisionCheck
from loraserve.adapterstore.yanks import YankOps
from loraserve.common.config.textlimits import (
    MAX_DESCRIPTION_BYTES,
    MAX_PAGE_BYTES,
    MAX_SIGNATURE_BYTES,
    check_bytes,
    check_text,
)
from loraserve.common.errors import InvalidArgument, Unavailable
from loraserve.common.revisions.manifest import Revision
from loraserve.common.revisions.names import validate_adapter_name
from loraserve.common.tracing import child_span, tracer
from loraserve.common.trust.policy import RevisionTrust, TrustSettings

log = logging.getLogger(__name__)
_TRACER = tracer(__name__)


@dataclass(frozen=True, slots=True)
class StoreSettings:
    limits: Limits
    heartbeat_interval: float = 10.0  # seconds of silence before a watch heartbeat
    download_chunk_size: int = 1024 * 1024
    # Encoded bytes of one listing page's entries; see textlimits.MAX_PAGE_BYTES.
    max_page_bytes: int = MAX_PAGE_BYTES
    # Seconds without reading the log's head from storage before this replica
    # counts as stale: health NOT_SERVING, heartbeats that send watchers elsewhere.
    max_staleness_s: float = 30.0
    # Seconds after which an upload an interrupted push left is swept at start-up
    # (see s3sweep); 0: never.
    stale_upload_age_s: float = 86_400.0
    # Seconds between checks of active rollouts' figures and guards (rollout/guard.py).
    rollout_check_interval_s: float = 5.0
    # What a push's signature must be (loraserve.common.trust.policy).
    trust: TrustSettings = field(default_factory=TrustSettings)


class AdapterStore:
    def __init__(
        self,
        blobs: BlobStore,
        changelog: ChangeLog,
        statuses: ReplicaStatusStore,
        settings: StoreSettings,
    ) -> None:
        self._blobs = blobs
        self._log = changelog
        self._settings = settings
        self._started = False
        self._watches = Watches(changelog, settings.heartbeat_interval)
        self._sweeping: asyncio.Task[None] | None = None
        self._guard = RolloutGuard(changelog, statuses, settings.rollout_check_interval_s)
        self._guarding: asyncio.Task[None] | None = None
        # What replicas report, and rollouts: the same log, their own modules.
        self.replicas = ReplicaOps(
            changelog, statuses, self._check_started, settings.max_page_bytes
        )
        self._trust = RevisionTrust(settings.trust)
        self._served = ServedRevisionCheck(changelog, self._trust)
        self.rollouts = RolloutOps(changelog, self._guard, self._check_started, self._served)
        self.quotas = QuotaOps(changelog, self._check_started)
        self.yanks = YankOps(changelog, self._check_started)

    @property
    def watch_count(self) -> int:
        """Watch streams open on this replica."""
        return self._watches.count

    @property
    def head_seq(self) -> int:
        return self._log.head_seq

    @property
    def incarnation(self) -> str:
        """The bucket's incarnation id (see incarnation.py)."""
        return self._log.incarnation

    async def start(self) -> None:
        """Loads the state from storage and starts following the log."""
        await self._log.start()
        self._started = True
        self._guarding = asyncio.create_task(self._guard.run(), name="rollout-guard")
        if self._settings.stale_upload_age_s > 0:
            cutoff = now() - timedelta(seconds=self._settings.stale_upload_age_s)
            self._sweeping = asyncio.create_task(self._sweep(cutoff), name="store-upload-sweep")

    async def _sweep(self, cutoff: datetime) -> None:
        """Deletes what pushes interrupted before `cutoff` left; in the background,
        since serving does not depend on it. A failure waits for the next start."""
        try:
            await self._blobs.sweep_stale_uploads(cutoff)
        except Unavailable as e:
            log.warning("store.upload_sweep_failed error=%s", e.message)

    @property
    def adapter_count(self) -> int:
        return len(self._log.state.adapters)

    @property
    def started(self) -> bool:
        return self._started

    @property
    def staleness_s(self) -> float:
        return self._log.staleness_s

    @property
    def following(self) -> bool:
        return self._log.following

    @property
    def max_staleness_s(self) -> float:
        return self._settings.max_staleness_s

    @property
    def fresh(self) -> bool:
        """Started, following the log, and in step with storage within `max_staleness_s`."""
        return (
            self._started
            and self._log.following
            and self._log.staleness_s <= self._settings.max_staleness_s
        )

    def _check_started(self) -> None:
        # The gRPC server runs (for health) before storage is reachable; calls then
        # must not answer from an empty state.
        if not self._started:
            raise Unavailable("the adapter store is starting: object storage not reached yet")

    def stop_watches(self) -> None:
        """Ends every watch stream with UNAVAILABLE, now and from now on. Called when a
        shutdown begins: a watch never finishes on its own, so it would otherwise hold
        the shutdown for the whole grace period instead of moving to another replica."""
        self._watches.stop()

    async def close(self) -> None:
        tasks = [t for t in (self._sweeping, self._guarding) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._log.close()

    async def push(
        self, header: PushHeader, chunks: AsyncIterator[Chunk], actor: str
    ) -> PushResult:
        self._check_started()
        with child_span(_TRACER, "loraserve.store.validate"):
            validate_adapter_name(header.name)
            check_text("description", header.description, MAX_DESCRIPTION_BYTES)
            # Whatever the signature policy: under off or warn nothing else bounds it.
            check_bytes("signature", header.signature, MAX_SIGNATURE_BYTES)
            check_idempotency_key(header.idempotency_key)
            check_declared_files(header.files, self._settings.limits)
        if header.idempotency_key and (done := await self._committed_push(header, chunks)):
            return done
        signed = self._trust.check_push(header.name, header.files, header.signature)
        received = await receive_adapter(header, chunks, self._blobs)
        await keep_files(received)
        files = received.infos
        change = await self._log.commit(
            revision_pushed(header, files, received.config, actor, signed),
            push_request_tag(header, files),
        )
        assert change is not None
        assert change.revision is not None
        rev, seq = change.revision.revision, change.seq
        log.info("adapter.pushed name=%s rev=%d seq=%d actor=%s", header.name, rev, seq, actor)
        return PushResult.of(change)

    async def next_revision(self, name: str) -> int:
        """The revision number the next push of `name` gets, unless another commits
        first: what a signed push signs."""
        self._check_started()
        validate_adapter_name(name)
        await self._log.sync()
        return self._log.state.next_revision(name)

    async def _committed_push(
        self, header: PushHeader, chunks: AsyncIterator[Chunk]
    ) -> PushResult | None:
        """The answer to a retry of a push the log already holds, before any byte of
        it is stored: from the header alone when it declares every file's sha256,
        else from the files hashed as they arrive (hashonly.py); None for a key not
        committed yet. The same key with other content is InvalidArgument."""
        if all(f.sha256 for f in header.files):
            change = await self._log.committed(push_request_tag(header, tuple(header.files)))
        elif await self._log.sync() and header.idempotency_key in self._log.state.requests:
            received = await receive_adapter(header, chunks, HashOnlyUploads())
            change = await self._log.committed(push_request_tag(header, received.infos))
            if change is None:
                raise Unavailable("cannot read the store's log now; push again")
        else:
            return None
        if change is None:
            return None
        log.info(
            "adapter.push_replayed name=%s seq=%d key=%s",
            header.name,
            change.seq,
            header.idempotency_key,
        )
        return PushResult.of(change)

    async def get(self, name: str, revision: int = 0) -> tuple[Adapter, Revision]:
        self._check_started()
        await self._log.sync()
        adapter = self._adapter(name)
        return detached(adapter), find_revision(adapter, revision)

    async def list_adapters(
        self,
        page_size: int,
        page_token: str,
        base_model: str = "",
        size_of: Callable[[Adapter], int] = lambda _: 0,
    ) -> AdapterPage:
        """A page of at most `page_size` adapters whose sizes (`size_of`, the encoded
        size) add up to at most `max_page_bytes`; never empty while adapters remain.

        Every page of a listing carries the first page's
        seq (in its token and its `seq`) and reflects at least that seq, so a watch
        from it sees every change the listing may have missed. A replica behind
        that seq catches up first; one that cannot read the log answers
        Unavailable, since the same page asked again (of it later, or of another
        replica) succeeds; ABORTED would wrongly tell the client to start over."""
        self._check_started()
        size = pagetokens.page_size(page_size)
        listing_seq, incarnation, after = pagetokens.decode_listing_token(page_token)
        caught_up = await self._log.sync()
        state = self._log.state
        if incarnation and incarnation != self.incarnation:
            raise InvalidArgument(
                f"page_token was made by store incarnation {incarnation}, but the store is "
                f"incarnation {self.incarnation} now (its bucket was started afresh); "
                "list again from the first page"
            )
        if state.seq < listing_seq and caught_up:
            raise InvalidArgument(
                f"page_token names seq {listing_seq}, beyond the store's last commit "
                f"{state.seq}; list again from the first page"
            )
        if state.seq < listing_seq:
            raise Unavailable(
                f"this store replica is at seq {state.seq}, behind the listing's seq "
                f"{listing_seq}, and cannot read the log now; ask for the page again"
            )
        seq = listing_seq if page_token else state.seq
        return adapter_page(
            state,
            size,
            self._settings.max_page_bytes,
            seq,
            self.incarnation,
            after,
            base_model,
            size_of,
        )

    async def list_revisions(
        self,
        name: str,
        page_size: int,
        page_token: str,
        size_of: Callable[[Revision, YankMark | None], int] = lambda *_: 0,
    ) -> RevisionPage:
        self._check_started()
        size = pagetokens.page_size(page_size)
        before = pagetokens.decode_revisions_token(page_token, name)
        await self._log.sync()
        return revision_page(
            self._adapter(name), size, self._settings.max_page_bytes, before, size_of
        )

    async def set_current(
        self,
        name: str,
        revision: int,
        expected_current: int,
        actor: str,
        idempotency_key: str = "",
    ) -> tuple[Adapter, int]:
        """Moves `current`; a no-op (no log entry) when `revision` is current already.
        A repeated idempotency key answers with the adapter as it is now and the seq
        of the change the key made."""
        self._check_started()
        validate_adapter_name(name)
        check_idempotency_key(idempotency_key)
        if revision < 1:
            raise InvalidArgument(f"revision must be >= 1, got {revision}")
        if expected_current < 0:
            raise InvalidArgument(
                f"expected_current_revision must be >= 0 (0: no expectation), "
                f"got {expected_current}"
            )
        await self._served.check(name, revision, "current")
        request = request_tag(idempotency_key, "set_current", name, revision, expected_current)
        change = await self._log.commit(
            current_set(name, revision, expected_current, actor), request
        )
        if change is not None:
            log.info(
                "adapter.current_set name=%s rev=%d seq=%d actor=%s",
                name,
                revision,
                change.seq,
                actor,
            )
        return detached(self._adapter(name)), self._log.head_seq if change is None else change.seq

    async def delete(self, name: str, actor: str, idempotency_key: str = "") -> int:
        self._check_started()
        validate_adapter_name(name)
        check_idempotency_key(idempotency_key)
        request = request_tag(idempotency_key, "delete", name)
        change = await self._log.commit(adapter_deleted(name, actor), request)
        assert change is not None
        log.info("adapter.deleted name=%s seq=%d actor=%s", name, change.seq, actor)
        return change.seq

    async def download(self, name: str, revision: int = 0) -> AsyncIterator[Revision | Chunk]:
        """Yields the manifest, then each file's chunks. Each file's last chunk is held
        back until the file's sha256 is verified, so a corrupt blob ends the stream
        with DataLoss before the client has the whole file."""
        self._check_started()
        await self._log.sync()
        manifest = find_revision(self._adapter(name), revision)
        yield manifest
        for info in manifest.files:
            async for chunk in read_verified(self._blobs, info, self._settings.download_chunk_size):
                yield chunk

    def watch(self, after_seq: int, incarnation: str = "") -> AsyncIterator[Change | Heartbeat]:
        """See `Watches.watch`."""
        self._check_started()
        return self._watches.watch(after_seq, incarnation)

    def _adapter(self, name: str) -> Adapter:
        validate_adapter_name(name)
        return find_adapter(self._log.state, name)
