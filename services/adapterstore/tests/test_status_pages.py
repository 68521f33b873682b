"""GetAdapterStatus comes in pages that any client can read, and reads each status from
storage once per change (issue 29, item 7): real gRPC on 127.0.0.1, S3 over real HTTP
(moto's server), through a proxy that sees every request."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import grpc
import pytest

from loraserve.adapterstore.catalog.pagetokens import MAX_PAGE_SIZE
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.s3.faults import S3FaultProxy
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import serve_store
from loraserve.testing.store.statuses import (
    MANY_REPLICAS,
    all_status_pages,
    report_nacks,
    write_statuses,
)

# Of the 1,100 NACKs, this many arrive as reports with 4 KiB reasons, which the store
# cuts; the others are written into the bucket as the store keeps them. All 1,100 as
# reports took up to three minutes of a CI worker, nearly all of it in the S3 emulator.
REPORTED = 100


@pytest.mark.slow
async def test_1100_nacks_with_4kib_reasons_come_in_pages_a_default_client_reads(
    s3_bucket: S3Bucket,
) -> None:
    async with serve_store(s3_bucket) as server:
        await push(server.stub, "x", tiny_adapter())
        await asyncio.to_thread(write_statuses, s3_bucket, "x", MANY_REPLICAS, first=REPORTED)
        await report_nacks(server.stub, "x", replicas=REPORTED)
        # A channel with gRPC's default 4 MiB receive limit, as grpcurl or any client has,
        # asking for the largest pages the store gives.
        async with grpc.aio.insecure_channel(server.address) as channel:
            stub = pb_grpc.AdapterStoreServiceStub(channel)
            pages = await all_status_pages(stub, "x", page_size=MAX_PAGE_SIZE)
    statuses = [s for page in pages for s in page.statuses]
    assert len(pages) > 1
    assert [s.replica_id for s in statuses] == [f"inference-{i:04d}" for i in range(MANY_REPLICAS)]
    assert max(len(s.last_error.message.encode()) for s in statuses) <= 1024
    assert all(s.last_error.message.startswith(f"replica {i}: ") for i, s in enumerate(statuses))


async def test_status_pages_read_each_status_from_storage_once_per_change(
    s3_bucket: S3Bucket, fault_proxy: S3FaultProxy
) -> None:
    async with serve_store(replace(s3_bucket, endpoint_url=fault_proxy.endpoint_url)) as server:
        await push(server.stub, "x", tiny_adapter())
        await report_nacks(server.stub, "x", replicas=120)
        first = await all_status_pages(server.stub, page_size=50)
        fault_proxy.requests.clear()
        again = await all_status_pages(server.stub, page_size=50)
        status_reads = [
            k for m, k in fault_proxy.requests if m == "GET" and k.startswith("status/")
        ]
    assert [len(p.statuses) for p in first] == [50, 50, 20]
    assert again == first
    assert status_reads == []


async def test_status_page_token_is_tied_to_its_name(s3_bucket: S3Bucket) -> None:
    async with serve_store(s3_bucket) as server:
        for name in ("x", "y"):
            await push(server.stub, name, tiny_adapter())
            await report_nacks(server.stub, name, replicas=3)
        first = await server.stub.GetAdapterStatus(pb.GetAdapterStatusRequest(page_size=2))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await server.stub.GetAdapterStatus(
                pb.GetAdapterStatusRequest(name="y", page_token=first.next_page_token)
            )
        rest = await server.stub.GetAdapterStatus(
            pb.GetAdapterStatusRequest(page_token=first.next_page_token)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [(s.adapter_name, s.replica_id[-1]) for s in (*first.statuses, *rest.statuses)] == [
        (name, str(i)) for name in ("x", "y") for i in range(3)
    ]
