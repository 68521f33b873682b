"""Bounded free text and byte-bounded listing pages, on a real store over S3 HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.config.textlimits import MAX_DESCRIPTION_BYTES, MAX_ERROR_MESSAGE_BYTES
from loraserve.testing.adapters.files import AdapterFiles, lora_config, tiny_adapter
from loraserve.testing.adapters.pushes import push_requests
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import StoreServer, serve_store
from loraserve.testing.store.statuses import refused, report_request

# gRPC's default receive limit, which the test channel keeps: every page must fit it.
DEFAULT_RECEIVE_LIMIT = 4 * 1024 * 1024
# Enough maximal descriptions that one page of them would pass that limit.
MANY = 70


@pytest.fixture
async def server(s3_bucket: S3Bucket):  # type: ignore[no-untyped-def]
    async with serve_store(s3_bucket) as running:
        yield running


async def _push(
    stub: pb_grpc.AdapterStoreServiceStub, name: str, files: AdapterFiles, **header: Any
) -> pb.PushAdapterResponse:
    return await stub.PushAdapter(push_requests(name, files, **header), timeout=60)  # type: ignore[no-any-return]


async def test_push_with_a_6_mib_description_is_invalid_argument_and_stores_nothing(
    server: StoreServer, s3_bucket: S3Bucket
) -> None:
    before = s3_bucket.keys()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _push(server.stub, "big-note", tiny_adapter(), description="x" * (6 * 1024 * 1024))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "description" in (caught.value.details() or "")
    assert str(MAX_DESCRIPTION_BYTES) in (caught.value.details() or "")
    assert s3_bucket.keys() == before


async def test_description_of_exactly_the_limit_is_kept(server: StoreServer) -> None:
    note = "é" * (MAX_DESCRIPTION_BYTES // 2)
    pushed = await _push(server.stub, "full-note", tiny_adapter(), description=note)
    assert pushed.revision.description == note


async def test_overlong_base_model_in_the_config_is_invalid_argument(server: StoreServer) -> None:
    files = tiny_adapter() | {
        "adapter_config.json": lora_config(base_model_name_or_path="m" * 2000)
    }
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _push(server.stub, "long-base", files)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "base_model_name_or_path" in (caught.value.details() or "")


async def test_nack_reason_over_the_limit_is_invalid_argument(server: StoreServer) -> None:
    await _push(server.stub, "nacked", tiny_adapter())
    request = report_request(
        "replica-1", {"nacked": refused(1, "r" * (MAX_ERROR_MESSAGE_BYTES + 1))}
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await server.stub.ReportReplicaStatus(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "error.message" in (caught.value.details() or "")
    status = await server.stub.GetAdapterStatus(pb.GetAdapterStatusRequest(name="nacked"))
    assert list(status.statuses) == []


async def test_adapters_with_maximal_descriptions_list_completely_across_pages(
    server: StoreServer,
) -> None:
    note = "d" * MAX_DESCRIPTION_BYTES
    files = tiny_adapter()
    names = [f"noted-{i:03d}" for i in range(MANY)]
    at_once = asyncio.Semaphore(8)

    async def push_one(name: str) -> None:
        async with at_once:
            await _push(server.stub, name, files, description=note)

    await asyncio.gather(*(push_one(n) for n in names))
    listed: list[str] = []
    pages = 0
    token = ""
    while True:
        page = await server.stub.ListAdapters(
            pb.ListAdaptersRequest(page_size=1000, page_token=token), timeout=30
        )
        assert page.ByteSize() < DEFAULT_RECEIVE_LIMIT
        listed += [a.name for a in page.adapters]
        pages += 1
        token = page.next_page_token
        if not token:
            break
    assert listed == names
    assert pages > 1


async def test_revisions_with_maximal_descriptions_list_completely_across_pages(
    server: StoreServer,
) -> None:
    note = "d" * MAX_DESCRIPTION_BYTES
    for seed in range(MANY):
        await _push(server.stub, "noted", tiny_adapter(seed=seed % 2), description=note)
    listed: list[int] = []
    token = ""
    while True:
        page = await server.stub.ListRevisions(
            pb.ListRevisionsRequest(name="noted", page_size=1000, page_token=token), timeout=30
        )
        assert page.ByteSize() < DEFAULT_RECEIVE_LIMIT
        listed += [r.revision for r in page.revisions]
        token = page.next_page_token
        if not token:
            break
    assert listed == list(range(MANY, 0, -1))


async def test_base_model_that_is_not_unicode_text_is_invalid_argument(
    server: StoreServer,
) -> None:
    # json.dumps writes the lone surrogate as the escape "\ud800", which parses back.
    files = tiny_adapter() | {"adapter_config.json": lora_config(base_model_name_or_path="\ud800")}
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await _push(server.stub, "surrogate", files)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "base_model_name_or_path" in (caught.value.details() or "")
