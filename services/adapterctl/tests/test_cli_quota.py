"""`adapterctl quota` against a real store over gRPC and S3 (moto): quotas are entries of
the store's change log (a store started afresh on the bucket, and every watcher, sees
them), and bad input is refused with a clear status or exit code with nothing
committed. tests/test_quota_enforcement.py runs a real replica that enforces them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.testing.adapters.ctl import CtlResult, ctl, write_adapter_dir
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import RunningStore, running_store


@pytest.fixture
async def store(s3_bucket: S3Bucket, tmp_path: Path) -> AsyncIterator[RunningStore]:
    """A store holding adapter alpha."""
    async with running_store(s3_bucket) as running:
        pushed = await run(running, "push", "alpha", str(write_adapter_dir(tmp_path / "a")))
        assert pushed.code == EXIT_OK, pushed.err
        yield running


@pytest.fixture
async def stub(store: RunningStore) -> AsyncIterator[pb_grpc.AdapterStoreServiceStub]:
    async with grpc.aio.insecure_channel(store.address) as channel:
        yield pb_grpc.AdapterStoreServiceStub(channel)


async def run(store: RunningStore, *argv: str) -> CtlResult:
    return await ctl(*argv, env={"ADAPTERSTORE_ADDR": store.address})


async def _quotas(address: str) -> pb.ListQuotasResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        response: pb.ListQuotasResponse = await pb_grpc.AdapterStoreServiceStub(channel).ListQuotas(
            pb.ListQuotasRequest()
        )
        return response


async def test_quota_set_and_default_are_log_entries_a_restarted_store_reads_back(
    store: RunningStore, s3_bucket: S3Bucket
) -> None:
    own = await run(store, "quota", "set", "alpha", "--max-in-flight", "2")
    default = await run(store, "quota", "set", "--default", "--tokens-per-minute", "600")
    assert (own.code, default.code) == (EXIT_OK, EXIT_OK), own.err + default.err
    assert "quota of alpha: in-flight 2 (seq 2)" in own.out
    assert "default quota: 600 tokens/min (seq 3)" in default.out
    async with running_store(s3_bucket) as restarted:
        response = await _quotas(restarted.address)
        shown = await run(restarted, "quota", "show")
    assert response.seq == 3
    assert response.default_quota.tokens_per_minute == 600
    assert [(q.adapter_name, q.quota.max_in_flight) for q in response.quotas] == [("alpha", 2)]
    assert "(default)  600 tokens/min" in shown.out
    assert "alpha      in-flight 2" in shown.out


async def test_quota_changes_reach_watchers_as_quota_events(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await run(store, "quota", "set", "alpha", "--tokens-per-second", "50")
    await run(store, "quota", "clear", "alpha")
    events = []
    async for message in stub.WatchAdapters(pb.WatchAdaptersRequest(after_seq=1)):
        if message.HasField("event"):
            events.append(message.event)
        if len(events) == 2:
            break
    assert [e.type for e in events] == [pb.EVENT_TYPE_QUOTA_CHANGED] * 2
    assert events[0].adapter_name == "alpha"
    assert events[0].quota.tokens_per_second == 50
    assert not events[1].HasField("quota")


async def test_listing_carries_each_adapters_quota_and_the_default(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await run(store, "quota", "set", "alpha", "--max-in-flight", "3")
    await run(store, "quota", "set", "--default", "--max-in-flight", "1")
    page = await stub.ListAdapters(pb.ListAdaptersRequest())
    assert page.adapters[0].quota.max_in_flight == 3
    assert page.default_quota.max_in_flight == 1


async def test_setting_the_quota_already_set_commits_nothing(store: RunningStore) -> None:
    first = await run(store, "quota", "set", "alpha", "--max-in-flight", "2")
    again = await run(store, "quota", "set", "alpha", "--max-in-flight", "2")
    assert "(seq 2)" in first.out
    assert "(seq 2)" in again.out


async def test_a_deleted_adapter_loses_its_quota(store: RunningStore) -> None:
    await run(store, "quota", "set", "alpha", "--max-in-flight", "2")
    await run(store, "delete", "alpha", "--yes")
    response = await _quotas(store.address)
    assert list(response.quotas) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("alpha", "--max-in-flight", "-1"), "--max-in-flight must be in [1, 1000000]"),
        (("alpha", "--tokens-per-second", "0"), "--tokens-per-second must be in [1, 1000000000]"),
        (("alpha", "--tokens-per-minute", "nan"), "--tokens-per-minute must be in [1, 1000000000]"),
        (("alpha",), "give at least one limit"),
        (("--max-in-flight", "1"), "give the adapter NAME, or --default"),
        (("alpha", "--default", "--max-in-flight", "1"), "NAME or --default, not both"),
        (("Bad Name!", "--max-in-flight", "1"), "adapter name"),
    ],
)
async def test_adapterctl_refuses_bad_quota_input_before_sending(
    store: RunningStore, argv: tuple[str, ...], message: str
) -> None:
    result = await run(store, "quota", "set", *argv)
    assert result.code == EXIT_USAGE
    assert message in result.err
    assert (await _quotas(store.address)).seq == 1


@pytest.mark.parametrize("value", ["1e-323", "5e-324", "0.5", "1e10"])
async def test_adapterctl_refuses_a_token_rate_outside_its_range_naming_the_range(
    store: RunningStore, value: str
) -> None:
    result = await run(store, "quota", "set", "alpha", "--tokens-per-minute", value)
    assert result.code == EXIT_USAGE, result.out
    assert "--tokens-per-minute must be in [1, 1000000000]" in result.err
    assert (await _quotas(store.address)).seq == 1


async def test_a_quota_for_an_unknown_adapter_is_not_found_and_nothing_stored(
    store: RunningStore,
) -> None:
    result = await run(store, "quota", "set", "ghost", "--max-in-flight", "1")
    assert result.code == EXIT_FAILED
    assert "adapter 'ghost' not found" in result.err
    assert (await _quotas(store.address)).seq == 1


@pytest.mark.parametrize(
    ("quota", "field"),
    [
        (pb.AdapterQuota(max_in_flight=-3), "max_in_flight"),
        (pb.AdapterQuota(tokens_per_second=-1.5), "tokens_per_second"),
        (pb.AdapterQuota(tokens_per_minute=float("inf")), "tokens_per_minute"),
        (pb.AdapterQuota(), "at least one limit"),
    ],
)
async def test_the_store_refuses_a_bad_quota_with_invalid_argument_and_stores_nothing(
    store: RunningStore,
    stub: pb_grpc.AdapterStoreServiceStub,
    quota: pb.AdapterQuota,
    field: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.SetQuota(pb.SetQuotaRequest(adapter_name="alpha", quota=quota))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (refused.value.details() or "")
    assert (await _quotas(store.address)).seq == 1


@pytest.mark.parametrize(
    ("quota", "message"),
    [
        (pb.AdapterQuota(tokens_per_minute=1e-323), "tokens_per_minute must be in [1, 1000000000]"),
        (pb.AdapterQuota(tokens_per_minute=5e-324), "tokens_per_minute must be in [1, 1000000000]"),
        (pb.AdapterQuota(tokens_per_second=1e300), "tokens_per_second must be in [1, 1000000000]"),
        (pb.AdapterQuota(max_in_flight=2**62), "max_in_flight must be in [1, 1000000]"),
    ],
)
async def test_the_store_refuses_a_limit_outside_its_range_naming_field_and_range(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, quota: pb.AdapterQuota, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.SetQuota(pb.SetQuotaRequest(adapter_name="alpha", quota=quota))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
    assert (await _quotas(store.address)).seq == 1


async def test_quota_show_json_names_the_adapter_and_its_limits(store: RunningStore) -> None:
    await run(store, "quota", "set", "alpha", "--tokens-per-second", "20")
    shown = await run(store, "quota", "show", "alpha", "--json")
    data = json.loads(shown.out)
    assert data["quotas"] == [
        {
            "adapter_name": "alpha",
            "quota": {"max_in_flight": 0, "tokens_per_second": 20.0, "tokens_per_minute": 0.0},
        }
    ]


def test_watch_prints_a_quota_change_with_its_limits() -> None:
    from loraserve.adapterctl.commands.read import describe_event

    event = pb.AdapterEvent(
        seq=9,
        type=pb.EVENT_TYPE_QUOTA_CHANGED,
        adapter_name="",
        quota=pb.AdapterQuota(max_in_flight=4),
        actor="ops",
    )
    cleared = pb.AdapterEvent(seq=10, type=pb.EVENT_TYPE_QUOTA_CHANGED, adapter_name="alpha")
    assert describe_event(event).endswith("quota (default) in-flight 4 by ops")
    assert describe_event(cleared).endswith("quota alpha cleared")
