"""Page tokens and write arguments the store did not make or allow are refused with
INVALID_ARGUMENT (issue 29, item 14): real gRPC on 127.0.0.1, S3 over real HTTP."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, rpc_code
from loraserve.testing.store.server import StoreServer, serve_store

# What int() accepts and no store ever writes, and numbers no page ends before.
FORGED_REVISIONS = ["+7", " 5 ", "1_0", "\u0663", "-1", "0", "07"]


@pytest.fixture(scope="module")
async def server(module_s3_bucket: S3Bucket) -> AsyncIterator[StoreServer]:
    """Adapters `a` (revisions 1-3) and `b`; every call here is refused or reads, so
    the tests share it."""
    async with serve_store(module_s3_bucket) as running:
        for seed in range(3):
            await push(running.stub, "a", tiny_adapter(seed=seed))
        await push(running.stub, "b", tiny_adapter())
        yield running


def _token(value: str) -> str:
    return base64.urlsafe_b64encode(value.encode()).decode()


@pytest.mark.parametrize("revision", FORGED_REVISIONS)
@pytest.mark.parametrize("with_name", [False, True], ids=["bare", "named"])
async def test_list_revisions_refuses_a_forged_page_token(
    server: StoreServer, revision: str, with_name: bool
) -> None:
    token = _token(f"a:{revision}" if with_name else revision)
    code = await rpc_code(
        server.stub.ListRevisions(pb.ListRevisionsRequest(name="a", page_token=token))
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_list_revisions_refuses_a_page_token_made_for_another_adapter(
    server: StoreServer,
) -> None:
    first = await server.stub.ListRevisions(pb.ListRevisionsRequest(name="a", page_size=1))
    code = await rpc_code(
        server.stub.ListRevisions(
            pb.ListRevisionsRequest(name="b", page_token=first.next_page_token)
        )
    )
    second = await server.stub.ListRevisions(
        pb.ListRevisionsRequest(name="a", page_token=first.next_page_token)
    )
    assert first.next_page_token
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert [r.revision for r in second.revisions] == [2, 1]


@pytest.mark.parametrize("value", ["0:a", "0:x:a", "00:a"])
async def test_list_adapters_refuses_a_forged_token_with_seq_0(
    server: StoreServer, value: str
) -> None:
    listed = await server.stub.ListAdapters(pb.ListAdaptersRequest())
    code = await rpc_code(
        server.stub.ListAdapters(
            pb.ListAdaptersRequest(page_token=_token(value.replace("x", listed.incarnation)))
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT


async def test_list_adapters_pages_still_follow_their_tokens(server: StoreServer) -> None:
    first = await server.stub.ListAdapters(pb.ListAdaptersRequest(page_size=1))
    second = await server.stub.ListAdapters(
        pb.ListAdaptersRequest(page_token=first.next_page_token)
    )
    assert [a.name for a in (*first.adapters, *second.adapters)] == ["a", "b"]
    assert second.seq == first.seq == 4


async def test_set_current_revision_with_negative_expectation_is_invalid_argument(
    server: StoreServer,
) -> None:
    code = await rpc_code(
        server.stub.SetCurrentRevision(
            pb.SetCurrentRevisionRequest(name="a", revision=1, expected_current_revision=-1)
        )
    )
    got = await server.stub.GetAdapter(pb.GetAdapterRequest(name="a"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert got.adapter.current_revision == 3
