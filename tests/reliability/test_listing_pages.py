"""The pages of one listing, asked of different store replicas,
never reflect a seq before the first page's.

Two store servers share one bucket; the second reaches S3 through the fault
proxy, which refuses its log reads, so it cannot catch up.
"""

from __future__ import annotations

import base64

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.s3.faults import Fault, S3FaultProxy
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore

pytestmark = pytest.mark.faults


async def _page(address: str, token: str) -> pb.ListAdaptersResponse:
    async with store_stub(address) as stub:
        page: pb.ListAdaptersResponse = await stub.ListAdapters(
            pb.ListAdaptersRequest(page_size=1, page_token=token), timeout=30
        )
    return page


async def test_page_from_a_replica_behind_the_listing_is_unavailable_then_complete(
    store_server: RunningStore, proxied_store: RunningStore, fault_proxy: S3FaultProxy
) -> None:
    async with store_stub(store_server.address) as stub:
        await push(stub, "a1", tiny_adapter())
        await push(stub, "a2", tiny_adapter())
    # The lagging replica has folded both pushes before its log reads are refused.
    async with store_stub(proxied_store.address) as stub:
        assert (await stub.ListAdapters(pb.ListAdaptersRequest())).seq == 2
    fault_proxy.add(Fault.REFUSE, "GET", "log/")
    async with store_stub(store_server.address) as stub:
        await push(stub, "b", tiny_adapter())
    first = await _page(store_server.address, "")
    assert ([a.name for a in first.adapters], first.seq) == (["a1"], 3)

    names = ["a1"]
    refusals: list[str] = []
    token = first.next_page_token
    while token:
        try:
            page = await _page(proxied_store.address, token)
        except grpc.aio.AioRpcError as e:
            refusals.append(f"{e.code().name}: {e.details()}")
            fault_proxy.clear()  # the replica can read the log again; ask for the same page
            continue
        assert page.seq == 3
        names += [a.name for a in page.adapters]
        token = page.next_page_token
    assert names == ["a1", "a2", "b"]
    assert len(refusals) == 1
    assert refusals[0].startswith("UNAVAILABLE: ")
    assert "behind the listing's seq 3" in refusals[0]


async def test_later_pages_from_a_replica_ahead_carry_the_first_pages_seq(
    store_server: RunningStore, proxied_store: RunningStore
) -> None:
    async with store_stub(store_server.address) as stub:
        await push(stub, "a1", tiny_adapter())
        await push(stub, "a2", tiny_adapter())
    first = await _page(proxied_store.address, "")
    async with store_stub(store_server.address) as stub:
        await push(stub, "a3", tiny_adapter())
    second = await _page(store_server.address, first.next_page_token)
    assert (first.seq, second.seq) == (2, 2)
    assert [a.name for a in second.adapters] == ["a2"]


async def test_page_token_without_a_seq_is_invalid_argument(store_server: RunningStore) -> None:
    async with store_stub(store_server.address) as stub:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListAdapters(pb.ListAdaptersRequest(page_token="YTE="))  # "a1"
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_page_token_beyond_the_stores_head_is_invalid_argument(
    store_server: RunningStore,
) -> None:
    async with store_stub(store_server.address) as stub:
        await push(stub, "a1", tiny_adapter())
        await push(stub, "a2", tiny_adapter())
        first = await stub.ListAdapters(pb.ListAdaptersRequest(page_size=1))
        forged = base64.urlsafe_b64encode(f"99:{first.incarnation}:a1".encode()).decode()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.ListAdapters(pb.ListAdaptersRequest(page_size=1, page_token=forged))
    assert base64.urlsafe_b64decode(first.next_page_token).decode() == f"2:{first.incarnation}:a1"
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "beyond the store's last commit 2" in (caught.value.details() or "")
