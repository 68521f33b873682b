"""`adapterctl push --wait` and `rollback --wait` against a real store over gRPC and S3
(moto): each returns once every live replica reports the revision, names each that
refused it (exit 1) or did not answer in time (exit 3). The replicas here are their
batched reports, sent over gRPC as inference replicas send them; tests/test_fleet.py
runs real replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from loraserve.adapterctl.commands import fleet_wait
from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.testing.adapters.ctl import CtlResult, ctl, write_adapter_dir
from loraserve.testing.store.server import RunningStore
from loraserve.testing.store.statuses import refused, report_request, routed
from loraserve.testing.waiting import eventually

REPLICAS = ("r1", "r2", "r3")


@pytest.fixture
async def stub(store_server: RunningStore) -> AsyncIterator[pb_grpc.AdapterStoreServiceStub]:
    async with grpc.aio.insecure_channel(store_server.address) as channel:
        yield pb_grpc.AdapterStoreServiceStub(channel)


class _Looks:
    """The replicas serving `revision` in each look the wait took at the fleet (its
    real calls, recorded): how a test knows the wait saw some reports and went on."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, revision: int) -> None:
        self.serving: list[set[str]] = []
        real = fleet_wait.statuses_of
        acks = {
            (revision, pb.REVISION_SERVING_STATE_ROUTED),
            (revision, pb.REVISION_SERVING_STATE_LOADED),
        }

        async def recorded(stub: Any, name: str, timeout_s: float) -> list[Any]:
            found = await real(stub, name, timeout_s)
            self.serving.append(
                {s.replica_id for s in found for r in s.revisions if (r.revision, r.state) in acks}
            )
            return found

        monkeypatch.setattr(fleet_wait, "statuses_of", recorded)

    def looked_again_after_seeing(self, replicas: set[str]) -> bool:
        return any(replicas <= seen for seen in self.serving[:-1])


async def _went_on_waiting(
    looks: _Looks, replicas: set[str], waiting: asyncio.Task[CtlResult]
) -> None:
    """Until the wait took another look after one that saw `replicas` serving, or ended."""
    await eventually(
        lambda: waiting.done() or looks.looked_again_after_seeing(replicas),
        f"the wait looked again after seeing {sorted(replicas)} serve",
    )


async def _fleet_serving_revision_one(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, tmp_path: Path
) -> None:
    env = {"ADAPTERSTORE_ADDR": store.address}
    result = await ctl("push", "alpha", str(write_adapter_dir(tmp_path / "v1")), env=env)
    assert result.code == EXIT_OK, result.err
    for replica in REPLICAS:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(1)}))


async def _when_pushed(stub: pb_grpc.AdapterStoreServiceStub, revision: int) -> None:
    async def pushed() -> bool:
        adapter = await stub.GetAdapter(pb.GetAdapterRequest(name="alpha"))
        return bool(adapter.adapter.current_revision == revision)

    await eventually(pushed, f"alpha@{revision} committed")


async def _push_wait(store: RunningStore, tmp_path: Path, *flags: str) -> asyncio.Task[CtlResult]:
    directory = str(write_adapter_dir(tmp_path / "v2", seed=1))
    env = {"ADAPTERSTORE_ADDR": store.address}
    return asyncio.create_task(ctl("push", "alpha", directory, "--wait", *flags, env=env))


async def test_push_wait_all_returns_once_every_live_replica_reports_the_revision(
    store_server: RunningStore,
    stub: pb_grpc.AdapterStoreServiceStub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _fleet_serving_revision_one(store_server, stub, tmp_path)
    looks = _Looks(monkeypatch, 2)
    waiting = await _push_wait(store_server, tmp_path, "all", "--timeout", "60")
    await _when_pushed(stub, 2)
    for replica in REPLICAS[:2]:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(2)}))
    await _went_on_waiting(looks, {"r1", "r2"}, waiting)
    assert not waiting.done(), "push --wait all returned before r3 reported"
    state = pb.REVISION_SERVING_STATE_ROUTED
    await stub.ReportReplicaStatus(report_request("r3", {"alpha": routed(2, state)}))
    result = await asyncio.wait_for(waiting, 60)
    assert result.code == EXIT_OK, result.err
    assert result.out.strip() == "alpha@2"
    assert "3 replica(s) serve alpha@2" in result.err


async def test_push_wait_names_the_replica_that_refused_the_revision_and_exits_1(
    store_server: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, tmp_path: Path
) -> None:
    await _fleet_serving_revision_one(store_server, stub, tmp_path)
    waiting = await _push_wait(store_server, tmp_path, "all", "--timeout", "60")
    await _when_pushed(stub, 2)
    for replica in REPLICAS[:2]:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(2)}))
    reason = "rank 64 exceeds --max-lora-rank 16"
    await stub.ReportReplicaStatus(report_request("r3", {"alpha": refused(2, reason)}))
    result = await asyncio.wait_for(waiting, 60)
    assert result.code == EXIT_FAILED
    assert f"replica r3 refused alpha@2: FAILED_PRECONDITION: {reason}" in result.err


async def test_push_wait_names_the_replica_that_did_not_answer_and_exits_3(
    store_server: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, tmp_path: Path
) -> None:
    await _fleet_serving_revision_one(store_server, stub, tmp_path)
    waiting = await _push_wait(store_server, tmp_path, "all", "--timeout", "3")
    await _when_pushed(stub, 2)
    for replica in REPLICAS[:2]:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(2)}))
    result = await asyncio.wait_for(waiting, 60)
    assert result.code == EXIT_UNREACHABLE
    err = result.err
    assert "replica r3 did not report alpha@2 in time" in err
    assert "r1" not in err
    assert "r2" not in err


async def test_push_wait_n_returns_once_n_replicas_serve_it(
    store_server: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, tmp_path: Path
) -> None:
    await _fleet_serving_revision_one(store_server, stub, tmp_path)
    waiting = await _push_wait(store_server, tmp_path, "2", "--timeout", "60")
    await _when_pushed(stub, 2)
    for replica in REPLICAS[:2]:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(2)}))
    result = await asyncio.wait_for(waiting, 60)
    assert result.code == EXIT_OK, result.err


async def _fleet_serving_revision_two(
    store: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, tmp_path: Path
) -> None:
    """alpha@1 and alpha@2 pushed, every replica reporting alpha@2."""
    await _fleet_serving_revision_one(store, stub, tmp_path)
    env = {"ADAPTERSTORE_ADDR": store.address}
    directory = str(write_adapter_dir(tmp_path / "v2", seed=2))
    result = await ctl("push", "alpha", directory, env=env)
    assert result.code == EXIT_OK, result.err
    for replica in REPLICAS:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(2)}))


async def _rollback_wait(store: RunningStore, *flags: str) -> asyncio.Task[CtlResult]:
    env = {"ADAPTERSTORE_ADDR": store.address}
    return asyncio.create_task(ctl("rollback", "alpha", "1", "--wait", *flags, env=env))


async def test_rollback_wait_all_returns_once_every_live_replica_reports_the_revision(
    store_server: RunningStore,
    stub: pb_grpc.AdapterStoreServiceStub,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _fleet_serving_revision_two(store_server, stub, tmp_path)
    looks = _Looks(monkeypatch, 1)
    waiting = await _rollback_wait(store_server, "all", "--timeout", "60")
    await _when_pushed(stub, 1)
    for replica in REPLICAS[:2]:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(1)}))
    await _went_on_waiting(looks, {"r1", "r2"}, waiting)
    assert not waiting.done(), "rollback --wait all returned before r3 reported"
    await stub.ReportReplicaStatus(report_request("r3", {"alpha": routed(1)}))
    result = await asyncio.wait_for(waiting, 60)
    assert result.code == EXIT_OK, result.err
    assert "3 replica(s) serve alpha@1" in result.err


async def test_rollback_wait_names_the_replica_that_did_not_answer_and_exits_3(
    store_server: RunningStore, stub: pb_grpc.AdapterStoreServiceStub, tmp_path: Path
) -> None:
    await _fleet_serving_revision_two(store_server, stub, tmp_path)
    waiting = await _rollback_wait(store_server, "all", "--timeout", "3")
    await _when_pushed(stub, 1)
    for replica in REPLICAS[:2]:
        await stub.ReportReplicaStatus(report_request(replica, {"alpha": routed(1)}))
    result = await asyncio.wait_for(waiting, 60)
    assert result.code == EXIT_UNREACHABLE
    assert "replica r3 did not report alpha@1 in time" in result.err
