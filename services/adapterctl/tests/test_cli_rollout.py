"""`adapterctl rollout` against a real store over gRPC and S3 (moto): the commands a
team runs, each bad input refused with a clear status and nothing committed, the
store's guards aborting a rollout by themselves from what replicas report (sent over
gRPC as inference replicas send them; tests/test_rollout.py runs a real replica), and
a promote that names the candidate it expects and waits out replicas' refusals unless
forced (issue 54, item 6)."""

from __future__ import annotations

import functools
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
from loraserve.testing.store.statuses import refused, report_request, routed
from loraserve.testing.waiting import eventually

BOUNDS = (0.1, 0.5, 1.0)


@pytest.fixture
async def store(s3_bucket: S3Bucket) -> AsyncIterator[RunningStore]:
    """A store whose guards look at the rollouts ten times a second."""
    async with running_store(s3_bucket, rollout_check_interval_s=0.1) as running:
        yield running


@pytest.fixture
async def stub(store: RunningStore) -> AsyncIterator[pb_grpc.AdapterStoreServiceStub]:
    async with grpc.aio.insecure_channel(store.address) as channel:
        yield pb_grpc.AdapterStoreServiceStub(channel)


async def run(store: RunningStore, *argv: str) -> CtlResult:
    return await ctl(*argv, env={"ADAPTERSTORE_ADDR": store.address})


@pytest.fixture
async def two_revisions(store: RunningStore, tmp_path: Path) -> None:
    """alpha@1 current, alpha@2 pushed without promoting."""
    for revision, flags in ((1, ()), (2, ("--no-promote",))):
        directory = write_adapter_dir(tmp_path / f"v{revision}", seed=revision)
        result = await run(store, "push", "alpha", str(directory), *flags)
        assert result.code == EXIT_OK, result.err


async def _current(stub: pb_grpc.AdapterStoreServiceStub) -> int:
    response = await stub.GetAdapter(pb.GetAdapterRequest(name="alpha"))
    return int(response.adapter.current_revision)


@pytest.mark.usefixtures("two_revisions")
async def test_start_set_and_promote_make_the_candidate_current(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    started = await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    weighed = await run(store, "rollout", "set", "alpha", "--weight", "50")
    assert await _current(stub) == 1
    promoted = await run(store, "rollout", "promote", "alpha", "--expect", "2")
    status = await run(store, "rollout", "status", "alpha")
    assert [r.code for r in (started, weighed, promoted, status)] == [EXIT_OK] * 4
    assert "rollout of alpha@2 from @1: active, 20 % to the candidate" in started.out
    assert "active, 50 %" in weighed.out
    assert "promoted" in status.out
    assert await _current(stub) == 2


@pytest.mark.usefixtures("two_revisions")
async def test_abort_keeps_the_current_revision_and_status_says_why(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    aborted = await run(store, "rollout", "abort", "alpha", "--reason", "latency looks off")
    status = await run(store, "rollout", "status", "alpha", "--json")
    assert aborted.code == EXIT_OK, aborted.err
    rollout = json.loads(status.out)["rollout"]
    assert (rollout["state"], rollout["end_reason"]) == (
        "ROLLOUT_STATE_ABORTED",
        "latency looks off",
    )
    assert await _current(stub) == 1


@pytest.mark.usefixtures("two_revisions")
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (("start", "alpha", "7", "--weight", "20"), "NOT_FOUND"),
        (("start", "ghost", "2", "--weight", "20"), "NOT_FOUND"),
        (("start", "alpha", "2", "--weight", "150"), "INVALID_ARGUMENT"),
        (("start", "alpha", "2", "--weight=-1"), "INVALID_ARGUMENT"),
        (("start", "alpha", "1", "--weight", "20"), "FAILED_PRECONDITION"),
        (("set", "alpha", "--weight", "30"), "FAILED_PRECONDITION"),
        (("promote", "alpha", "--expect", "2"), "FAILED_PRECONDITION"),
    ],
)
async def test_bad_rollout_commands_exit_1_naming_the_problem_and_commit_nothing(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, argv: tuple[str, ...], expected: str
) -> None:
    result = await run(store, "rollout", *argv)
    assert result.code == EXIT_FAILED
    assert expected in result.err
    assert store.store.head_seq == 2


@pytest.mark.usefixtures("two_revisions")
@pytest.mark.parametrize(
    "argv",
    [
        ("rollout", "start", "alpha", "2", "--weight", "10"),
        ("rollback", "alpha", "2"),
        ("delete", "alpha", "--yes"),
    ],
)
async def test_changes_that_would_break_an_active_rollout_are_refused(
    store: RunningStore, argv: tuple[str, ...]
) -> None:
    await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    result = await run(store, *argv)
    assert result.code == EXIT_FAILED
    assert "FAILED_PRECONDITION" in result.err
    assert store.store.head_seq == 3


@pytest.mark.usefixtures("two_revisions")
async def test_rollout_of_a_deleted_adapter_is_refused_naming_the_delete(
    store: RunningStore,
) -> None:
    deleted = await run(store, "delete", "alpha", "--yes")
    assert deleted.code == EXIT_OK, deleted.err
    result = await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    assert result.code == EXIT_FAILED
    assert "NOT_FOUND" in result.err
    assert "deleted" in result.err
    assert store.store.head_seq == 3


@pytest.mark.usefixtures("two_revisions")
async def test_promote_after_abort_is_refused(store: RunningStore) -> None:
    await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    await run(store, "rollout", "abort", "alpha")
    result = await run(store, "rollout", "promote", "alpha", "--expect", "2")
    assert result.code == EXIT_FAILED
    assert "FAILED_PRECONDITION" in result.err
    assert store.store.head_seq == 4


async def _aborted(stub: pb_grpc.AdapterStoreServiceStub) -> bool:
    response = await stub.GetRollout(pb.GetRolloutRequest(name="alpha"))
    return bool(response.rollout.state == pb.ROLLOUT_STATE_ABORTED)


@pytest.mark.usefixtures("two_revisions")
async def test_the_store_aborts_a_rollout_a_replica_refuses_and_status_says_why(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    await stub.ReportReplicaStatus(report_request("r1", {"alpha": routed(1)}))
    nack = refused(2, "rank 64 exceeds --max-lora-rank 16")
    nack.serving_revision = 1
    nack.revisions.insert(0, pb.RevisionStatus(revision=1, state=pb.REVISION_SERVING_STATE_LOADED))
    nack.revisions[1].candidate = True
    await stub.ReportReplicaStatus(report_request("r2", {"alpha": nack}))

    await eventually(lambda: _aborted(stub), "the guard aborted the rollout")
    status = await run(store, "rollout", "status", "alpha")
    assert "aborted" in status.out
    assert "replica r2 refused alpha@2" in status.out
    assert "rank 64 exceeds --max-lora-rank 16" in status.out
    assert await _current(stub) == 1


def _counts(revision: int, requests: int, errors: int) -> pb.RevisionCounters:
    """`requests`, the last of them from each of three callers."""
    callers = [
        pb.CallerSighting(caller=c, last_request=requests - c) for c in range(min(3, requests))
    ]
    return pb.RevisionCounters(
        adapter_name="alpha",
        revision=revision,
        requests=requests,
        errors=errors,
        generated_tokens=requests,
        ttft_buckets=[requests] * (len(BOUNDS) + 1),
        callers=callers,
    )


async def _guard_has_read(stub: pb_grpc.AdapterStoreServiceStub, current_requests: int) -> bool:
    """Whether the guard took r1's counters with the current arm at `current_requests`:
    they are cumulative, so the guard needs a first sample to count from."""
    response = await stub.GetRollout(pb.GetRolloutRequest(name="alpha"))
    if response.rollout.state != pb.ROLLOUT_STATE_ACTIVE:
        return True
    seen = [r.replica_id for r in response.candidate_by_replica] == ["r1"]
    return seen and response.figures[0].requests == current_requests


@pytest.mark.usefixtures("two_revisions")
async def test_the_store_aborts_a_rollout_whose_candidate_errs_above_the_margin(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    started = await run(
        store,
        "rollout", "start", "alpha", "2", "--weight", "50",
        "--max-error-rate-margin", "10", "--min-requests", "10",
    )  # fmt: skip
    assert started.code == EXIT_OK, started.err
    for current, candidate in (((0, 0), (0, 0)), ((100, 0), (40, 20))):
        request = report_request("r1", {"alpha": routed(1)})
        request.counters_epoch = "run-1"
        request.ttft_bounds_seconds.extend(BOUNDS)
        request.counters.extend([_counts(1, *current), _counts(2, *candidate)])
        await stub.ReportReplicaStatus(request)
        took = functools.partial(_guard_has_read, stub, current[0])
        await eventually(took, "the guard took the replica's counters")

    await eventually(lambda: _aborted(stub), "the guard aborted the rollout")
    status = await run(store, "rollout", "status", "alpha")
    assert "rollout-guard" in status.out
    assert "error rate 50.0 % (20 of 40 requests to @2)" in status.out
    assert await _current(stub) == 1


@pytest.mark.usefixtures("two_revisions")
async def test_promote_without_expect_is_a_usage_error(store: RunningStore) -> None:
    await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    result = await run(store, "rollout", "promote", "alpha")
    assert result.code == EXIT_USAGE
    assert "--expect" in result.err
    assert store.store.head_seq == 3


@pytest.mark.usefixtures("two_revisions")
async def test_promote_expecting_another_candidate_is_aborted_naming_both(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await run(store, "rollout", "start", "alpha", "2", "--weight", "20")
    result = await run(store, "rollout", "promote", "alpha", "--expect", "1")
    assert result.code == EXIT_FAILED
    assert "ABORTED" in result.err
    assert "rollout of alpha@2" in result.err
    assert "not of alpha@1 as expected" in result.err
    assert await _current(stub) == 1


async def _replica_r2_refuses_the_candidate(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    """alpha@2 in a rollout whose guard ignores NACKs; replica r2 refuses @2."""
    started = await run(
        store, "rollout", "start", "alpha", "2", "--weight", "20", "--no-abort-on-nack"
    )
    assert started.code == EXIT_OK, started.err
    await stub.ReportReplicaStatus(report_request("r1", {"alpha": routed(1)}))
    nack = refused(2, "rank 64 exceeds --max-lora-rank 16")
    await stub.ReportReplicaStatus(report_request("r2", {"alpha": nack}))


@pytest.mark.usefixtures("two_revisions")
async def test_promote_while_a_replica_refuses_the_candidate_is_refused_naming_it(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await _replica_r2_refuses_the_candidate(store, stub)
    result = await run(store, "rollout", "promote", "alpha", "--expect", "2")
    assert result.code == EXIT_FAILED
    assert "FAILED_PRECONDITION" in result.err
    assert "replica r2 refused alpha@2" in result.err
    assert await _current(stub) == 1


@pytest.mark.usefixtures("two_revisions")
async def test_promote_with_force_goes_on_while_a_replica_refuses_the_candidate(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub
) -> None:
    await _replica_r2_refuses_the_candidate(store, stub)
    result = await run(store, "rollout", "promote", "alpha", "--expect", "2", "--force")
    assert result.code == EXIT_OK, result.err
    assert await _current(stub) == 2
