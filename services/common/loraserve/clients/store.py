"""The adapter store client: its channel, paging, and typed domain calls.

`store_channel` is every caller's channel to the store (adapterctl, the inference
service, the demo, the benchmarks): the shared message limit and gRPC's retry
policy for the calls that are safe to send again. `pages` reads every page of a
listing. `StoreClient` is what the inference service needs, as typed calls: it
turns protos into frozen dataclasses and gRPC failures into
`loraserve.common.errors`, so the cache and the synchronizer never see grpc types
and can be tested against fakes. Pushes are in `loraserve.clients.push`.

The address is one gRPC target that may name every store replica (a DNS name with
one record per replica, or `ipv4:HOST:PORT,HOST:PORT`). The channel balances calls
round-robin over the replicas whose grpc.health.v1 status is SERVING, so a store
replica that cannot reach object storage gets no new calls; a watch already open
on it ends when its heartbeats say it has not confirmed its seq against storage
for `max_staleness_s`, and the synchronizer's reconnect lands on a healthy one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import grpc

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.clients.channels import Retry, open_channel
from loraserve.clients.downloads import FileChunk, revision_urls_from_proto
from loraserve.clients.replicareport import StatusBatch, report_requests
from loraserve.clients.storetypes import EventKind as EventKind
from loraserve.clients.storetypes import Heartbeat as Heartbeat
from loraserve.clients.storetypes import ListedAdapter as ListedAdapter
from loraserve.clients.storetypes import Listing as Listing
from loraserve.clients.storetypes import RolloutSplit as RolloutSplit
from loraserve.clients.storetypes import StoreEvent as StoreEvent
from loraserve.clients.storetypes import (
    event_from_proto,
    heartbeat_from_proto,
    listed_adapter_from_proto,
    listing_from_proto,
)
from loraserve.common import errors
from loraserve.common.revisions.manifest import Revision, revision_from_proto
from loraserve.common.revisions.presigned import RevisionUrls
from loraserve.common.rpc.security import ClientSecurity

log = logging.getLogger(__name__)

STORE_SERVICE = pb.DESCRIPTOR.services_by_name["AdapterStoreService"].full_name
# The calls gRPC may send again after UNAVAILABLE: reads, a replica's reports (they
# state a fact), and the writes whose request carries an idempotency key (every
# attempt resends the same message, so the same key). Not PushAdapter (see
# `loraserve.clients.push`) nor WatchAdapters (a watch resumes from its seq).
RETRIED_METHODS = (
    "GetAdapter",
    "ListAdapters",
    "ListRevisions",
    "GetAdapterStatus",
    "DownloadAdapter",
    "GetDownloadUrls",
    "ReportReplicaAlive",
    "ReportReplicaStatus",
    "GetRollout",
    "SetCurrentRevision",
    "DeleteAdapter",
    "StartRollout",
    "SetRolloutWeight",
    "PromoteRollout",
    "AbortRollout",
    "YankRevision",
    "UnyankRevision",
)
# CANCELLED too: a store shutting down ends the calls it received but had not handed
# to a handler with it (grpc/grpc#41785). Each call here is safe to send again even had
# it run (a read, a fact, a write with its idempotency key); the client's own cancel
# is never retried.
STORE_RETRY = Retry(
    max_attempts=3,
    initial_backoff_s=0.5,
    max_backoff_s=4.0,
    codes=("UNAVAILABLE", "CANCELLED"),
)


def store_channel(
    address: str,
    security: ClientSecurity,
    *,
    health_checked: bool = False,
    reconnect_backoff_max_s: float | None = None,
) -> grpc.aio.Channel:
    """A channel to the store at `address`. With `health_checked`, calls go
    round-robin to the replicas whose grpc.health.v1 status is SERVING."""
    return open_channel(
        address,
        security,
        method_configs=[STORE_RETRY.method_config(STORE_SERVICE, RETRIED_METHODS)],
        health_checked_service=STORE_SERVICE if health_checked else None,
        reconnect_backoff_max_s=reconnect_backoff_max_s,
    )


def store_stub(channel: grpc.aio.Channel) -> Any:
    return pb_grpc.AdapterStoreServiceStub(channel)


class Page(Protocol):
    @property
    def next_page_token(self) -> str: ...


P = TypeVar("P", bound=Page)


async def pages(
    method: Callable[..., Awaitable[P]], request: Any, timeout: float | None
) -> AsyncIterator[P]:
    """Every page of a listing, in order: `request` again with each next_page_token.
    A listing's seq is its first page's: watching from it misses no later change."""
    request = type(request).FromString(request.SerializeToString())
    while True:
        page = await method(request, timeout=timeout)
        yield page
        if not page.next_page_token:
            return
        request.page_token = page.next_page_token


def _store_error(exc: grpc.aio.AioRpcError, what: str) -> errors.LoraserveError:
    error = errors.error_from_rpc(exc)
    return type(error)(f"adapter store {what}: {error.message}")


_KNOWN_EVENT_TYPES = frozenset(kind.value for kind in EventKind)


@dataclass(frozen=True)
class StoreClientSettings:
    """How the inference service talks to the store."""

    address: str
    security: ClientSecurity
    replica_id: str
    # Deadline of unary calls (list pages, reports), seconds.
    call_timeout_s: float = 10.0
    # A watch or download that sends nothing for this long is treated as dead;
    # must exceed the store's heartbeat interval.
    idle_timeout_s: float = 30.0
    page_size: int = 500
    # Longest wait of gRPC's own reconnect backoff; its default (120 s) would leave
    # a replica stale long after the store came back.
    reconnect_backoff_max_s: float = 5.0
    # A watch whose heartbeat says the store replica has not confirmed its seq
    # against storage for longer than this ends, to be resumed on another replica.
    max_staleness_s: float = 30.0


class StoreClient:
    """Typed calls to the adapter store for one inference replica."""

    def __init__(self, channel: grpc.aio.Channel, settings: StoreClientSettings) -> None:
        self._channel = channel
        self._stub = pb_grpc.AdapterStoreServiceStub(channel)
        self._settings = settings

    @classmethod
    def connect(cls, settings: StoreClientSettings) -> StoreClient:
        channel = store_channel(
            settings.address,
            settings.security,
            health_checked=True,
            reconnect_backoff_max_s=settings.reconnect_backoff_max_s,
        )
        return cls(channel, settings)

    @property
    def replica_id(self) -> str:
        return self._settings.replica_id

    async def close(self) -> None:
        await self._channel.close()

    async def list_adapters(self, base_model: str = "") -> Listing:
        """Every adapter, all pages; the seq is the first page's, so watching from
        it sees every change made while the later pages were read. A store started
        afresh between two pages refuses the second page's token (INVALID_ARGUMENT);
        listing again from the first page is the answer."""
        adapters: list[ListedAdapter] = []
        first: pb.ListAdaptersResponse | None = None
        request = pb.ListAdaptersRequest(page_size=self._settings.page_size, base_model=base_model)
        try:
            async for page in pages(
                self._stub.ListAdapters, request, self._settings.call_timeout_s
            ):
                first = first or page
                adapters.extend(listed_adapter_from_proto(a) for a in page.adapters)
        except grpc.aio.AioRpcError as exc:
            raise _store_error(exc, "list adapters") from exc
        assert first is not None, "a listing has at least one page"
        return listing_from_proto(first, adapters)

    async def get_revision(self, name: str, revision: int) -> Revision:
        """The manifest of one revision; raises NotFound if it (or the adapter) is gone."""
        response: pb.GetAdapterResponse = await self._unary(
            f"get {name}@{revision}",
            self._stub.GetAdapter,
            pb.GetAdapterRequest(name=name, revision=revision),
        )
        return revision_from_proto(response.revision)

    async def watch(
        self, after_seq: int, incarnation: str = ""
    ) -> AsyncGenerator[StoreEvent | Heartbeat, None]:
        """Changes after `after_seq`, in order, and heartbeats. Raises OutOfRange
        when `after_seq` is older than the store's kept log, or is not a seq of the
        store's `incarnation` (given, it must be the store's)."""
        call = self._stub.WatchAdapters(
            pb.WatchAdaptersRequest(after_seq=after_seq, incarnation=incarnation)
        )
        async with aclosing(self._stream(f"watch after seq {after_seq}", call)) as messages:
            async for message in messages:
                if message.HasField("heartbeat"):
                    heartbeat = heartbeat_from_proto(message.heartbeat)
                    if heartbeat.stale_s > self._settings.max_staleness_s:
                        raise errors.Unavailable(
                            f"adapter store replica has not confirmed seq {heartbeat.seq} "
                            f"against object storage for {heartbeat.stale_s:.0f}s; "
                            "watching another replica"
                        )
                    yield heartbeat
                elif message.HasField("event"):
                    if message.event.type not in _KNOWN_EVENT_TYPES:
                        # A newer store's kind of change; the next listing reconciles it.
                        log.warning(
                            "store.unknown_event seq=%d type=%d",
                            message.event.seq,
                            message.event.type,
                        )
                        continue
                    yield event_from_proto(message.event)

    async def download(
        self, name: str, revision: int
    ) -> AsyncGenerator[Revision | FileChunk, None]:
        """The revision's manifest first, then each file's chunks in manifest order."""
        call = self._stub.DownloadAdapter(pb.DownloadAdapterRequest(name=name, revision=revision))
        async with aclosing(self._stream(f"download {name}@{revision}", call)) as messages:
            async for message in messages:
                if message.HasField("manifest"):
                    yield revision_from_proto(message.manifest)
                elif message.HasField("chunk"):
                    chunk = message.chunk
                    yield FileChunk(chunk.file_name, chunk.offset, chunk.data)

    async def report_status(self, batch: StatusBatch) -> bool:
        """Sends a batched report (in as many calls as its size needs); False when the
        store had let this replica's statuses expire: the next batch should carry
        every shard."""
        known = True
        for request in report_requests(self._settings.replica_id, batch):
            response: pb.ReportReplicaStatusResponse = await self._unary(
                "report status", self._stub.ReportReplicaStatus, request
            )
            known = known and response.known
        return known

    async def download_urls(self, name: str, revision: int) -> RevisionUrls:
        """The manifest and presigned URLs of the revision's files; Unimplemented from
        a store that hands out none (an older one, or `--download-url-ttl 0`)."""
        request = pb.GetDownloadUrlsRequest(name=name, revision=revision)
        response = await self._unary(
            f"download URLs of {name}@{revision}", self._stub.GetDownloadUrls, request
        )
        return revision_urls_from_proto(response)

    async def _unary(self, what: str, method: Callable[..., Any], request: Any) -> Any:
        try:
            return await method(request, timeout=self._settings.call_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _store_error(exc, what) from exc

    async def _stream(self, what: str, call: Any) -> AsyncGenerator[Any, None]:
        """Messages of a server stream; cancels the call however the caller stops."""
        try:
            while True:
                try:
                    async with asyncio.timeout(self._settings.idle_timeout_s):
                        message = await call.read()
                except TimeoutError as exc:
                    raise errors.Unavailable(
                        f"adapter store {what}: nothing received for "
                        f"{self._settings.idle_timeout_s:g}s"
                    ) from exc
                except grpc.aio.AioRpcError as exc:
                    raise _store_error(exc, what) from exc
                if message is grpc.aio.EOF:
                    return
                yield message
        finally:
            call.cancel()
