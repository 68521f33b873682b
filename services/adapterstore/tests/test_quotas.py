"""Quotas, store side, over real gRPC and S3 (moto): a quota is one log entry that
ListQuotas and every watcher show and a restarted store folds back; setting what is
set commits nothing; a retry with the same key is answered with the first seq; bad
input is refused naming the problem, with nothing committed. What a replica does with
a quota is in services/inference/tests/serving/test_quota_gate.py and
tests/test_quota_enforcement.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import first_watch_messages, push
from loraserve.testing.store.server import StoreServer, serve_store

LIMITS = pb.AdapterQuota(max_in_flight=4, tokens_per_minute=6000)


@pytest.fixture
async def served(s3_bucket: S3Bucket) -> AsyncIterator[StoreServer]:
    """alpha@1 (seq 1)."""
    async with serve_store(s3_bucket) as server:
        await push(server.stub, "alpha", tiny_adapter(seed=1))
        yield server


async def _set(server: StoreServer, name: str = "alpha", **request: Any) -> int:
    response: pb.SetQuotaResponse = await server.stub.SetQuota(
        pb.SetQuotaRequest(adapter_name=name, **request)
    )
    return response.seq


async def _listed(server: StoreServer) -> pb.ListQuotasResponse:
    listed: pb.ListQuotasResponse = await server.stub.ListQuotas(pb.ListQuotasRequest())
    return listed


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value


async def test_a_quota_is_listed_as_of_the_seq_it_committed_at(served: StoreServer) -> None:
    seq = await _set(served, quota=LIMITS)

    listed = await _listed(served)

    assert seq == 2
    assert [(q.adapter_name, q.quota) for q in listed.quotas] == [("alpha", LIMITS)]
    assert (listed.seq, listed.HasField("default_quota")) == (2, False)


async def test_a_restarted_store_folds_the_quotas_back(s3_bucket: S3Bucket) -> None:
    async with serve_store(s3_bucket) as first:
        await push(first.stub, "alpha", tiny_adapter(seed=1))
        await _set(first, quota=LIMITS)
        await _set(first, "", quota=pb.AdapterQuota(tokens_per_second=50))

    async with serve_store(s3_bucket) as again:
        listed = await _listed(again)

    assert [(q.adapter_name, q.quota) for q in listed.quotas] == [("alpha", LIMITS)]
    assert listed.default_quota == pb.AdapterQuota(tokens_per_second=50)


async def test_setting_the_quota_already_set_commits_nothing_and_answers_the_head(
    served: StoreServer,
) -> None:
    first = await _set(served, quota=LIMITS)

    again = await _set(served, quota=LIMITS)

    assert again == first == served.store.head_seq


async def test_a_retry_with_the_same_key_is_answered_with_the_first_seq(
    served: StoreServer,
) -> None:
    first = await _set(served, quota=LIMITS, idempotency_key="quota-1")
    # Another change between the two: a retry must not be taken for a new change.
    await _set(served, quota=pb.AdapterQuota(max_in_flight=9))

    retried = await _set(served, quota=LIMITS, idempotency_key="quota-1")

    assert (first, retried, served.store.head_seq) == (2, 2, 3)


async def test_an_unset_quota_clears_it(served: StoreServer) -> None:
    await _set(served, quota=LIMITS)

    seq = await _set(served)
    listed = await _listed(served)

    assert (seq, list(listed.quotas)) == (3, [])


async def test_the_default_quota_is_listed_apart_and_cleared_alike(served: StoreServer) -> None:
    default = pb.AdapterQuota(tokens_per_second=50)
    await _set(served, "", quota=default)
    listed = await _listed(served)

    await _set(served, "")
    cleared = await _listed(served)

    assert (listed.default_quota, list(listed.quotas)) == (default, [])
    assert not cleared.HasField("default_quota")


async def test_set_and_cleared_quotas_reach_watchers_as_quota_events(served: StoreServer) -> None:
    await _set(served, quota=LIMITS)
    await _set(served)

    events = [m.event for m in await first_watch_messages(served.stub, 1, 2)]

    assert [e.type for e in events] == [pb.EVENT_TYPE_QUOTA_CHANGED] * 2
    assert [e.adapter_name for e in events] == ["alpha", "alpha"]
    assert (events[0].quota, events[1].HasField("quota")) == (LIMITS, False)


async def test_a_quota_of_an_adapter_that_does_not_exist_is_not_found(
    served: StoreServer,
) -> None:
    refused = await _refused(_set(served, "beta", quota=LIMITS))

    assert refused.code() == grpc.StatusCode.NOT_FOUND
    assert "beta" in (refused.details() or "")
    assert served.store.head_seq == 1


@pytest.mark.parametrize(
    ("quota", "named"),
    [
        (pb.AdapterQuota(max_in_flight=1_000_001), "max_in_flight"),
        (pb.AdapterQuota(tokens_per_second=-1), "tokens_per_second"),
        (pb.AdapterQuota(tokens_per_minute=2e9), "tokens_per_minute"),
        (pb.AdapterQuota(), "at least one limit"),
    ],
)
async def test_a_quota_out_of_range_or_with_no_limit_is_invalid_and_commits_nothing(
    served: StoreServer, quota: pb.AdapterQuota, named: str
) -> None:
    refused = await _refused(_set(served, quota=quota))

    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in (refused.details() or "")
    assert served.store.head_seq == 1


async def test_a_quota_for_a_malformed_name_is_invalid(served: StoreServer) -> None:
    refused = await _refused(_set(served, "../alpha", quota=LIMITS))

    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert served.store.head_seq == 1
