"""Yanked revisions (issue 54, item 5), store side, over real gRPC and S3 (moto): a yank
is one log entry that GetAdapter, ListRevisions and every watcher show and a restarted
store folds back; a yanked revision cannot be made current or rolled out; neither the
current revision nor a rollout's candidate can be yanked; bad input is refused with
nothing committed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import first_watch_messages, push, store_stub
from loraserve.testing.store.server import StoreServer, running_store, serve_store

REASON = "answers with the system prompt"


@pytest.fixture
async def served(s3_bucket: S3Bucket) -> AsyncIterator[StoreServer]:
    """alpha@1, and alpha@2 current (seq 2)."""
    async with serve_store(s3_bucket) as server:
        await push(server.stub, "alpha", tiny_adapter(seed=1))
        await push(server.stub, "alpha", tiny_adapter(seed=2))
        yield server


async def _yank(server: StoreServer, revision: int = 1, **request: Any) -> pb.YankRevisionResponse:
    fields: dict[str, Any] = {"name": "alpha", "revision": revision, "reason": REASON} | request
    response: pb.YankRevisionResponse = await server.stub.YankRevision(
        pb.YankRevisionRequest(**fields)
    )
    return response


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value


async def test_a_yank_is_shown_by_get_adapter_and_list_revisions(served: StoreServer) -> None:
    response = await _yank(served)

    got = await served.stub.GetAdapter(pb.GetAdapterRequest(name="alpha"))
    listed = await served.stub.ListRevisions(pb.ListRevisionsRequest(name="alpha"))

    assert (response.seq, response.yank.revision, response.yank.reason) == (3, 1, REASON)
    assert response.yank.yanked_by == "tester"
    assert list(got.adapter.yanked_revisions) == [response.yank]
    assert list(listed.yanks) == [response.yank]


async def test_yank_and_unyank_reach_watchers_as_yank_events(served: StoreServer) -> None:
    await _yank(served)
    await served.stub.UnyankRevision(pb.UnyankRevisionRequest(name="alpha", revision=1))

    events = [m.event for m in await first_watch_messages(served.stub, 2, 2)]

    assert [e.type for e in events] == [pb.EVENT_TYPE_YANK_CHANGED] * 2
    assert [e.revision.revision for e in events] == [1, 1]
    assert (events[0].yank.reason, events[1].HasField("yank")) == (REASON, False)


async def test_a_yanked_revision_cannot_be_made_current(served: StoreServer) -> None:
    await _yank(served)

    refused = await _refused(
        served.stub.SetCurrentRevision(pb.SetCurrentRevisionRequest(name="alpha", revision=1))
    )

    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"alpha@1 is yanked: {REASON}" in (refused.details() or "")
    assert served.store.head_seq == 3


async def test_a_yanked_revision_cannot_be_rolled_out(served: StoreServer) -> None:
    await _yank(served)

    refused = await _refused(
        served.stub.StartRollout(pb.StartRolloutRequest(name="alpha", revision=1, weight=10))
    )

    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "alpha@1 is yanked" in (refused.details() or "")


async def test_unyanking_lets_the_revision_be_made_current_again(served: StoreServer) -> None:
    await _yank(served)
    unyanked = await served.stub.UnyankRevision(pb.UnyankRevisionRequest(name="alpha", revision=1))

    moved = await served.stub.SetCurrentRevision(
        pb.SetCurrentRevisionRequest(name="alpha", revision=1)
    )

    assert (unyanked.seq, moved.adapter.current_revision) == (4, 1)
    assert list(moved.adapter.yanked_revisions) == []


async def test_the_current_revision_cannot_be_yanked(served: StoreServer) -> None:
    refused = await _refused(_yank(served, 2))

    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "alpha@2 is the current revision" in (refused.details() or "")


async def test_an_active_rollouts_candidate_cannot_be_yanked(served: StoreServer) -> None:
    await push(served.stub, "alpha", tiny_adapter(seed=3), no_promote=True)
    await served.stub.StartRollout(pb.StartRolloutRequest(name="alpha", revision=3, weight=10))

    refused = await _refused(_yank(served, 3))

    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "alpha@3 is the candidate" in (refused.details() or "")


BAD_YANKS = {
    "unknown revision": ({"revision": 9}, grpc.StatusCode.NOT_FOUND, "alpha@9 not found"),
    "unknown adapter": ({"name": "beta"}, grpc.StatusCode.NOT_FOUND, "'beta' not found"),
    "revision zero": ({"revision": 0}, grpc.StatusCode.INVALID_ARGUMENT, "revision must be"),
    "bad name": ({"name": "Alpha"}, grpc.StatusCode.INVALID_ARGUMENT, "invalid adapter name"),
    "no reason": ({"reason": ""}, grpc.StatusCode.INVALID_ARGUMENT, "needs a reason"),
    "blank reason": ({"reason": " \n"}, grpc.StatusCode.INVALID_ARGUMENT, "needs a reason"),
    "long reason": ({"reason": "x" * 1025}, grpc.StatusCode.INVALID_ARGUMENT, "reason is 1025"),
}


@pytest.mark.parametrize(("fields", "code", "problem"), BAD_YANKS.values(), ids=BAD_YANKS)
async def test_a_bad_yank_is_refused_naming_the_problem_with_nothing_committed(
    served: StoreServer, fields: dict[str, Any], code: grpc.StatusCode, problem: str
) -> None:
    request = {"revision": 1, **fields}

    refused = await _refused(_yank(served, **request))

    assert (refused.code(), served.store.head_seq) == (code, 2)
    assert problem in (refused.details() or "")


async def test_unyanking_a_revision_that_does_not_exist_is_not_found(served: StoreServer) -> None:
    refused = await _refused(
        served.stub.UnyankRevision(pb.UnyankRevisionRequest(name="alpha", revision=9))
    )

    assert refused.code() == grpc.StatusCode.NOT_FOUND


async def test_a_retried_yank_with_its_key_commits_once(served: StoreServer) -> None:
    first = await _yank(served, idempotency_key="yank-1")
    again = await _yank(served, idempotency_key="yank-1")

    assert (first.seq, again.seq, served.store.head_seq) == (3, 3, 3)
    assert again.yank == first.yank


async def test_a_yank_outlives_a_store_restart(s3_bucket: S3Bucket) -> None:
    async with serve_store(s3_bucket) as server:
        await push(server.stub, "alpha", tiny_adapter(seed=1))
        await push(server.stub, "alpha", tiny_adapter(seed=2))
        yanked = (await _yank(server)).yank

    async with running_store(s3_bucket) as restarted, store_stub(restarted.address) as stub:
        got = await stub.GetAdapter(pb.GetAdapterRequest(name="alpha"))

    assert list(got.adapter.yanked_revisions) == [yanked]
