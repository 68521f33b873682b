"""Many replica statuses at once, as a fleet of inference replicas reports them."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from loraserve.adapterstore.replicas.model import SignOfLife, replica_key, shard_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.config.textlimits import MAX_ERROR_MESSAGE_BYTES
from loraserve.common.fleet.reports import AdapterReport, ReplicaError, RevisionReport, ServingState
from loraserve.common.statusshards import shard_of
from loraserve.testing.s3.endpoint import S3Bucket

# The case: 1,100 NACKs, each with a reason of the full 4 KiB allowed.
MANY_REPLICAS = 1100
_CONCURRENCY = 32


def report_request(
    replica: str,
    adapters: dict[str, pb.AdapterReport],
    applied_seq: int = 0,
    interval_s: float = 60.0,
) -> pb.ReportReplicaStatusRequest:
    """A batched report of `replica` carrying the shards of `adapters` (name -> report)."""
    shards: dict[int, list[pb.AdapterReport]] = {}
    for name, report in sorted(adapters.items()):
        report.adapter_name = name
        shards.setdefault(shard_of(name), []).append(report)
    return pb.ReportReplicaStatusRequest(
        replica_id=replica,
        applied_seq=applied_seq,
        report_interval_seconds=interval_s,
        shards=[pb.StatusShard(index=i, adapters=a) for i, a in sorted(shards.items())],
    )


def routed(
    revision: int, state: pb.RevisionServingState = pb.REVISION_SERVING_STATE_LOADED
) -> pb.AdapterReport:
    """An adapter report: `revision` serving, in `state`."""
    return pb.AdapterReport(
        serving_revision=revision, revisions=[pb.RevisionStatus(revision=revision, state=state)]
    )


def refused(revision: int, reason: str, code: int = 9) -> pb.AdapterReport:
    """An adapter report: `revision` FAILED (a NACK) with `reason`, nothing serving."""
    return pb.AdapterReport(
        revisions=[
            pb.RevisionStatus(
                revision=revision,
                state=pb.REVISION_SERVING_STATE_FAILED,
                error=pb.ErrorStatus(code=code, message=reason),
            )
        ]
    )


async def report_nacks(stub: Any, adapter: str, replicas: int = MANY_REPLICAS) -> None:
    """A NACK of `adapter`@1 with a 4 KiB reason from each of `replicas` replicas."""
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def report(index: int) -> None:
        reason = f"replica {index}: " + "x" * MAX_ERROR_MESSAGE_BYTES
        request = report_request(
            f"inference-{index:04d}", {adapter: refused(1, reason[:MAX_ERROR_MESSAGE_BYTES])}
        )
        async with limit:
            await stub.ReportReplicaStatus(request, timeout=60)

    await asyncio.gather(*(report(i) for i in range(replicas)))


async def all_status_pages(stub: Any, name: str = "", page_size: int = 0) -> list[Any]:
    """Every page of GetAdapterStatus, following next_page_token."""
    request = pb.GetAdapterStatusRequest(name=name, page_size=page_size)
    pages = []
    while True:
        page = await stub.GetAdapterStatus(request, timeout=60)
        pages.append(page)
        if not page.next_page_token:
            return pages
        request.page_token = page.next_page_token


def write_statuses(
    bucket: S3Bucket, adapter: str, replicas: int = MANY_REPLICAS, first: int = 0
) -> None:
    """Signs of life and status shards of replicas `first` to `replicas` - 1 NACKing
    `adapter`@1 with reasons of about 1 KiB (what the store keeps of a longer one),
    written straight into the bucket (as store replicas would have, over time): far
    quicker than reporting them."""
    client = bucket.client()

    def write(index: int) -> None:
        replica = f"inference-{index:04d}"
        time = datetime.now(UTC)
        report = AdapterReport(
            adapter,
            0,
            (
                RevisionReport(
                    1, ServingState.FAILED, ReplicaError(9, f"replica {index}: " + "x" * 1000)
                ),
            ),
        )
        shard = {
            "replica_id": replica,
            "shard": shard_of(adapter),
            "update_time": time.isoformat(),
            "adapters": [report.to_json()],
        }
        sign = SignOfLife(replica, time, interval_s=60.0)
        for key, data in (
            (shard_key(shard_of(adapter), replica), shard),
            (replica_key(replica), sign.to_json()),
        ):
            client.put_object(Bucket=bucket.bucket, Key=key, Body=json.dumps(data))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(first, replicas)))
