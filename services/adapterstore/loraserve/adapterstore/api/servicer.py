"""AdapterStoreService over gRPC: translates messages to store calls and back.

Errors are the store's domain exceptions; the server's interceptor turns them
into statuses. The writer's identity comes from the auth layer, which puts the
token's principal into `current_principal` for the duration of the call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from loraserve.adapterstore.api import protoconv
from loraserve.adapterstore.api.tracing import describe_push, describe_pushed, server_span
from loraserve.adapterstore.catalog import Adapter, YankMark
from loraserve.adapterstore.files import Chunk, DownloadUrls
from loraserve.adapterstore.replicas.model import ReplicaStatus
from loraserve.adapterstore.rollout import protoconv as rolloutconv
from loraserve.adapterstore.rollout.ops import RolloutResult
from loraserve.adapterstore.store import AdapterStore
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.quota import quota_from_proto, quota_to_proto
from loraserve.common.revisions.manifest import Revision, revision_to_proto, timestamp
from loraserve.common.rpc.auth import reporting_identity
from loraserve.common.rpc.security import Role, current_principal

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["AdapterStoreService"].full_name
_PREFIX = f"/{SERVICE_NAME}/"
# The role each method needs (loraserve.common.rpc.auth: admin ⊇ writer ⊇ reader); every
# method is listed, so a new one is a decision, not a default.
# Pushing adds a revision; admin work changes or removes what replicas serve; what
# replicas say about themselves needs a replica credential, for that replica only.
METHOD_ROLES: Mapping[str, Role] = {
    **{
        _PREFIX + m: Role.READER
        for m in (
            "GetAdapter",
            "GetNextRevision",
            "ListAdapters",
            "ListRevisions",
            "DownloadAdapter",
            "GetDownloadUrls",
            "WatchAdapters",
            "GetAdapterStatus",
            "GetRollout",
            "ListQuotas",
        )
    },
    _PREFIX + "PushAdapter": Role.WRITER,
    **{
        _PREFIX + m: Role.ADMIN
        for m in (
            "SetCurrentRevision",
            "DeleteAdapter",
            "StartRollout",
            "SetRolloutWeight",
            "PromoteRollout",
            "AbortRollout",
            "SetQuota",
            "YankRevision",
            "UnyankRevision",
        )
    },
    **{
        _PREFIX + m: Role.REPLICA
        for m in ("ReportStatus", "ReportReplicaAlive", "ReportReplicaStatus")
    },
}

Context = grpc.aio.ServicerContext[Any, Any]


class AdapterStoreServicer:
    def __init__(
        self,
        store: AdapterStore,
        principal: Callable[[], str] = current_principal.get,
        urls: DownloadUrls | None = None,
        reporter: Callable[[], str | None] = reporting_identity,
        trace_principals: bool = False,
    ) -> None:
        self._store = store
        self._principal = principal
        self._reporter = reporter
        # Whether a push's span names who pushed (`--trace-principals`).
        self._trace_principals = trace_principals
        self._urls = urls if urls is not None else DownloadUrls(store, None, 0)

    async def PushAdapter(
        self, request_iterator: AsyncIterator[pb.PushAdapterRequest], context: Context
    ) -> pb.PushAdapterResponse:
        requests = aiter(request_iterator)

        async def chunks() -> AsyncIterator[Chunk]:
            async for message in requests:
                yield protoconv.push_chunk(message)

        with server_span("push", SERVICE_NAME, "PushAdapter", context) as span:
            header = protoconv.push_header(await anext(requests, pb.PushAdapterRequest()))
            actor = self._principal()
            describe_push(span, header, actor if self._trace_principals else "")
            result = await self._store.push(header, chunks(), actor)
            describe_pushed(span, result)
        return pb.PushAdapterResponse(
            revision=revision_to_proto(result.revision), promoted=result.promoted, seq=result.seq
        )

    async def GetAdapter(
        self, request: pb.GetAdapterRequest, context: Context
    ) -> pb.GetAdapterResponse:
        adapter, revision = await self._store.get(request.name, request.revision)
        return pb.GetAdapterResponse(
            adapter=protoconv.adapter(adapter), revision=revision_to_proto(revision)
        )

    async def GetNextRevision(
        self, request: pb.GetNextRevisionRequest, context: Context
    ) -> pb.GetNextRevisionResponse:
        return pb.GetNextRevisionResponse(revision=await self._store.next_revision(request.name))

    async def ListAdapters(
        self, request: pb.ListAdaptersRequest, context: Context
    ) -> pb.ListAdaptersResponse:
        # Each adapter is converted once: the page is cut by encoded size.
        converted: dict[str, pb.Adapter] = {}

        def size_of(adapter: Adapter) -> int:
            message = converted[adapter.name] = protoconv.adapter(adapter)
            return message.ByteSize()

        page = await self._store.list_adapters(
            request.page_size, request.page_token, request.base_model, size_of=size_of
        )
        response = pb.ListAdaptersResponse(
            adapters=[converted[a.name] for a in page.adapters],
            next_page_token=page.next_page_token,
            seq=page.seq,
            incarnation=page.incarnation,
        )
        if page.default_quota is not None:
            response.default_quota.CopyFrom(quota_to_proto(page.default_quota))
        return response

    async def ListRevisions(
        self, request: pb.ListRevisionsRequest, context: Context
    ) -> pb.ListRevisionsResponse:
        page = await self._store.list_revisions(
            request.name,
            request.page_size,
            request.page_token,
            size_of=_revision_size,
        )
        return pb.ListRevisionsResponse(
            revisions=[revision_to_proto(r) for r in page.revisions],
            next_page_token=page.next_page_token,
            current_revision=page.current_revision,
            yanks=[
                protoconv.revision_yank(n, m) for n, m in sorted(page.yanks.items(), reverse=True)
            ],
        )

    async def SetCurrentRevision(
        self, request: pb.SetCurrentRevisionRequest, context: Context
    ) -> pb.SetCurrentRevisionResponse:
        adapter, seq = await self._store.set_current(
            request.name,
            request.revision,
            request.expected_current_revision,
            self._principal(),
            request.idempotency_key,
        )
        return pb.SetCurrentRevisionResponse(adapter=protoconv.adapter(adapter), seq=seq)

    async def DeleteAdapter(
        self, request: pb.DeleteAdapterRequest, context: Context
    ) -> pb.DeleteAdapterResponse:
        seq = await self._store.delete(request.name, self._principal(), request.idempotency_key)
        return pb.DeleteAdapterResponse(seq=seq)

    async def DownloadAdapter(
        self, request: pb.DownloadAdapterRequest, context: Context
    ) -> AsyncIterator[pb.DownloadAdapterResponse]:
        async for item in self._store.download(request.name, request.revision):
            yield protoconv.download_response(item)

    async def GetDownloadUrls(
        self, request: pb.GetDownloadUrlsRequest, context: Context
    ) -> pb.GetDownloadUrlsResponse:
        with server_span("download_urls", SERVICE_NAME, "GetDownloadUrls", context) as span:
            if span.is_recording():
                span.set_attributes(
                    {"loraserve.adapter": request.name, "loraserve.revision": request.revision}
                )
            urls = await self._urls.revision_urls(request.name, request.revision)
        return protoconv.download_urls(urls)

    async def WatchAdapters(
        self, request: pb.WatchAdaptersRequest, context: Context
    ) -> AsyncIterator[pb.WatchAdaptersResponse]:
        async for item in self._store.watch(request.after_seq, request.incarnation):
            yield protoconv.watch_response(item)

    async def ReportStatus(
        self, request: pb.ReportStatusRequest, context: Context
    ) -> pb.ReportStatusResponse:
        self._store.replicas.refuse_single_report()
        return pb.ReportStatusResponse()

    async def ReportReplicaAlive(
        self, request: pb.ReportReplicaAliveRequest, context: Context
    ) -> pb.ReportReplicaAliveResponse:
        known = await self._store.replicas.alive(request.replica_id, self._reporter())
        return pb.ReportReplicaAliveResponse(known=known)

    async def ReportReplicaStatus(
        self, request: pb.ReportReplicaStatusRequest, context: Context
    ) -> pb.ReportReplicaStatusResponse:
        report = protoconv.replica_report(request)
        known = await self._store.replicas.report(report, self._reporter())
        return pb.ReportReplicaStatusResponse(known=known)

    async def GetAdapterStatus(
        self, request: pb.GetAdapterStatusRequest, context: Context
    ) -> pb.GetAdapterStatusResponse:
        converted: dict[tuple[str, str], pb.ReplicaAdapterStatus] = {}

        def size_of(status: ReplicaStatus) -> int:
            message = protoconv.replica_status(status)
            converted[status.adapter_name, status.replica_id] = message
            return message.ByteSize()

        page = await self._store.replicas.page(
            request.name, request.page_size, request.page_token, size_of
        )
        return pb.GetAdapterStatusResponse(
            statuses=[converted[s.adapter_name, s.replica_id] for s in page.statuses],
            next_page_token=page.next_page_token,
        )

    async def StartRollout(
        self, request: pb.StartRolloutRequest, context: Context
    ) -> pb.RolloutResponse:
        result = await self._store.rollouts.start(
            request.name,
            request.revision,
            request.weight,
            rolloutconv.guards(request.guards),
            self._principal(),
            request.idempotency_key,
        )
        return _rollout_response(result)

    async def SetRolloutWeight(
        self, request: pb.SetRolloutWeightRequest, context: Context
    ) -> pb.RolloutResponse:
        result = await self._store.rollouts.set_weight(
            request.name, request.weight, self._principal(), request.idempotency_key
        )
        return _rollout_response(result)

    async def PromoteRollout(
        self, request: pb.PromoteRolloutRequest, context: Context
    ) -> pb.RolloutResponse:
        result = await self._store.rollouts.promote(
            request.name,
            request.expected_candidate_revision,
            self._principal(),
            request.idempotency_key,
            request.force,
        )
        return _rollout_response(result)

    async def AbortRollout(
        self, request: pb.AbortRolloutRequest, context: Context
    ) -> pb.RolloutResponse:
        result = await self._store.rollouts.abort(
            request.name, request.reason, self._principal(), request.idempotency_key
        )
        return _rollout_response(result)

    async def GetRollout(
        self, request: pb.GetRolloutRequest, context: Context
    ) -> pb.GetRolloutResponse:
        view = await self._store.rollouts.get(request.name)
        response = pb.GetRolloutResponse(
            rollout=rolloutconv.rollout(view.rollout, view.candidate),
            figures=[rolloutconv.figures(f) for f in view.figures],
            candidate_by_replica=[
                pb.ReplicaArmFigures(replica_id=replica, figures=rolloutconv.figures(f))
                for replica, f in view.candidate_by_replica
            ],
        )
        if view.figures_time is not None:
            response.figures_time.CopyFrom(timestamp(view.figures_time))
        return response

    async def SetQuota(self, request: pb.SetQuotaRequest, context: Context) -> pb.SetQuotaResponse:
        quota = quota_from_proto(request.quota) if request.HasField("quota") else None
        seq = await self._store.quotas.set(
            request.adapter_name, quota, self._principal(), request.idempotency_key
        )
        return pb.SetQuotaResponse(seq=seq)

    async def ListQuotas(
        self, request: pb.ListQuotasRequest, context: Context
    ) -> pb.ListQuotasResponse:
        listed = await self._store.quotas.list()
        response = pb.ListQuotasResponse(
            quotas=[
                pb.NamedQuota(adapter_name=name, quota=quota_to_proto(quota))
                for name, quota in listed.quotas
            ],
            seq=listed.seq,
        )
        if listed.default is not None:
            response.default_quota.CopyFrom(quota_to_proto(listed.default))
        return response

    async def YankRevision(
        self, request: pb.YankRevisionRequest, context: Context
    ) -> pb.YankRevisionResponse:
        result = await self._store.yanks.yank(
            request.name,
            request.revision,
            request.reason,
            self._principal(),
            request.idempotency_key,
        )
        yank = protoconv.revision_yank(result.revision, result.mark)
        return pb.YankRevisionResponse(yank=yank, seq=result.seq)

    async def UnyankRevision(
        self, request: pb.UnyankRevisionRequest, context: Context
    ) -> pb.UnyankRevisionResponse:
        seq = await self._store.yanks.unyank(
            request.name, request.revision, self._principal(), request.idempotency_key
        )
        return pb.UnyankRevisionResponse(seq=seq)


def _revision_size(revision: Revision, yank: YankMark | None) -> int:
    """What a revision adds to a ListRevisions page: its manifest and its yank."""
    size = revision_to_proto(revision).ByteSize()
    return size + (protoconv.revision_yank(revision.revision, yank).ByteSize() if yank else 0)


def _rollout_response(result: RolloutResult) -> pb.RolloutResponse:
    return pb.RolloutResponse(
        rollout=rolloutconv.rollout(result.rollout, result.candidate), seq=result.seq
    )


def register(servicer: AdapterStoreServicer) -> Callable[[grpc.aio.Server], None]:
    """The `register` callback for `loraserve.common.rpc.server.start_server`."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_AdapterStoreServiceServicer_to_server(servicer, server)

    return add
