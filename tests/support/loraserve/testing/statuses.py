"""Many replica statuses at once, as a fleet of inference replicas reports them."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from loraserve.adapterstore.status import ReplicaError, ReplicaStatus, ReportType, status_key
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.common.textlimits import MAX_ERROR_MESSAGE_BYTES
from loraserve.testing.s3 import S3Bucket

# The case: 1,100 NACKs, each with a reason of the full 4 KiB allowed.
MANY_REPLICAS = 1100
_CONCURRENCY = 32


async def report_nacks(stub: Any, adapter: str, replicas: int = MANY_REPLICAS) -> None:
    """A NACK of `adapter`@1 with a 4 KiB reason from each of `replicas` replicas."""
    limit = asyncio.Semaphore(_CONCURRENCY)

    async def report(index: int) -> None:
        reason = f"replica {index}: " + "x" * MAX_ERROR_MESSAGE_BYTES
        request = pb.ReportStatusRequest(
            replica_id=f"inference-{index:04d}",
            adapter_name=adapter,
            revision=1,
            type=pb.REPORT_TYPE_NACK,
            error=pb.ErrorStatus(code=9, message=reason[:MAX_ERROR_MESSAGE_BYTES]),
        )
        async with limit:
            await stub.ReportStatus(request, timeout=60)

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


def write_statuses(bucket: S3Bucket, adapter: str, replicas: int = MANY_REPLICAS) -> None:
    """Status objects of `replicas` replicas NACKing `adapter`@1, written straight into
    the bucket (as store replicas would have, over time): quicker than reporting them."""
    client = bucket.client()

    def write(index: int) -> None:
        status = ReplicaStatus(
            replica_id=f"inference-{index:04d}",
            adapter_name=adapter,
            serving_revision=0,
            reported_revision=1,
            type=ReportType.NACK,
            last_error=ReplicaError(9, f"replica {index}: " + "x" * 1000, 1),
            update_time=datetime.now(UTC),
        )
        key = status_key(adapter, status.replica_id)
        client.put_object(Bucket=bucket.bucket, Key=key, Body=json.dumps(status.to_json()))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(write, range(replicas)))
