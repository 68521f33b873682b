"""What inference replicas report, and reading it back: the store's operations on
replica statuses, independent of gRPC (objects and costs: model.py,
writes.py, reads.py)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from loraserve.adapterstore.catalog import find_adapter
from loraserve.adapterstore.catalog import page_size as checked_page_size
from loraserve.adapterstore.changelog import ChangeLog
from loraserve.adapterstore.replicas.model import ReplicaReport, ReplicaStatus, check_report
from loraserve.adapterstore.replicas.reads import decode_token, encode_token
from loraserve.adapterstore.replicas.writes import ReplicaStatusStore
from loraserve.common.errors import FailedPrecondition, PermissionDenied
from loraserve.common.revisions.names import validate_adapter_name


def check_reporter(replica_id: str, reporter: str | None) -> None:
    """Refuses a report about `replica_id` from a caller whose credential names another
    replica (`reporter`; None where the store authenticates nobody and trusts every
    caller alike): otherwise one replica's token could make up replicas that ACK a push,
    NACK someone's rollout or keep a dead one looking live."""
    if reporter is not None and reporter != replica_id:
        raise PermissionDenied(
            f"this credential belongs to replica {reporter!r}, which cannot report for "
            f"replica {replica_id!r}: each replica reports for itself, with its own token "
            "(PRINCIPAL:TOKEN) or certificate and a matching --replica-id"
        )


@dataclass(frozen=True, slots=True)
class StatusPage:
    statuses: list[ReplicaStatus]
    next_page_token: str


class ReplicaOps:
    def __init__(
        self,
        changelog: ChangeLog,
        statuses: ReplicaStatusStore,
        check_started: Callable[[], None],
        max_page_bytes: int,
    ) -> None:
        self._log = changelog
        self._statuses = statuses
        self._check_started = check_started
        self._max_page_bytes = max_page_bytes

    async def report(self, report: ReplicaReport, reporter: str | None = None) -> bool:
        """Records a batched report (seeing commits made through other store replicas
        first) from `reporter` (see check_reporter); False when the replica had expired
        and should send every shard."""
        self._check_started()
        check_report(report)
        check_reporter(report.replica_id, reporter)
        await self._log.sync()
        state = self._log.state

        def exists(name: str, revision: int) -> bool:
            adapter = state.adapters.get(name)
            return adapter is not None and (not revision or revision in adapter.revisions)

        return await self._statuses.report(report, exists)

    async def alive(self, replica_id: str, reporter: str | None = None) -> bool:
        """A sign of life alone; False if the replica had expired."""
        self._check_started()
        check_reporter(replica_id, reporter)
        return await self._statuses.alive(replica_id)

    def refuse_single_report(self) -> None:
        """ReportStatus, one adapter at a time, is what replicas of earlier versions send."""
        raise FailedPrecondition(
            "ReportStatus is no longer accepted: this store keeps replica statuses in "
            "batches (ReportReplicaStatus); upgrade the inference replica"
        )

    async def page(
        self,
        name: str,
        page_size: int,
        page_token: str,
        size_of: Callable[[ReplicaStatus], int],
    ) -> StatusPage:
        """A page of every live replica's status of `name` (of every adapter when
        empty), by adapter then replica, cut by `size_of` at the page byte limit."""
        self._check_started()
        size = checked_page_size(page_size)
        if name:
            validate_adapter_name(name)
        after = decode_token(page_token, name)
        await self._log.sync()
        state = self._log.state
        if name:
            find_adapter(state, name)
            names = [name]
        else:
            first = bisect.bisect_left(state.names, after[0])
            names = state.names[first : first + size + 1]
        statuses, position = await self._statuses.reader.page(
            names, size, after, self._max_page_bytes, size_of
        )
        token = encode_token(name, position) if position is not None else ""
        return StatusPage(statuses, token)
