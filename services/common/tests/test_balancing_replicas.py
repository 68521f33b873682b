"""The client's bounded-load routing over real gRPC servers standing in for replicas:
each answers Generate with its own name and GetReplicaLoad with the load a test sets."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
import pytest

from loraserve.clients.balancing import BoundedLoad, ReplicaSet, preference
from loraserve.clients.balancing import replicas as replicas_module
from loraserve.clients.balancing.replicas import MAX_TOKENS_PER_SEQUENCE
from loraserve.clients.inference import InferenceClient, RetryPolicy
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.fakes.clock import ManualClock
from loraserve.testing.waiting import eventually

FAST = BoundedLoad(poll_interval_s=0.02)
RETRY = RetryPolicy(max_attempts=10, initial_backoff=0.01, max_backoff=0.05)


class ReportingReplica(pb_grpc.InferenceServiceServicer):  # type: ignore[misc]
    """Answers Generate with its name (after `hold` is set, when given) and reports
    `pending` and `resident` as its load, `rates` its admissions per second by adapter
    (none: a release before them) and `tokens` its tokens per sequence; `reports` False
    answers UNIMPLEMENTED."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pending = 0
        self.resident: list[str] = []
        self.reports = True
        self.adapters: dict[str, int] = {}
        self.rates: dict[str, float] = {}
        self.tokens: dict[str, float] = {}
        self.hold: asyncio.Event | None = None
        self.polls = 0
        # Seconds each load report takes to answer.
        self.answers_after = 0.0

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        yield pb.GenerateResponse(text=self.name)
        if self.hold is not None:
            await self.hold.wait()
        yield pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP)

    async def GetReplicaLoad(self, request: Any, context: Any) -> pb.GetReplicaLoadResponse:
        self.polls += 1
        await asyncio.sleep(self.answers_after)
        if not self.reports:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no such method")
        return pb.GetReplicaLoadResponse(
            pending_sequences=self.pending,
            resident_adapters=self.resident,
            replica_id=self.name,
            adapter_pending_sequences=self.adapters,
            adapter_admission_rates=self.rates,
            adapter_tokens_per_sequence=self.tokens,
            reports_tokens_per_sequence=True,
        )


@asynccontextmanager
async def fleet(count: int) -> AsyncIterator[dict[str, tuple[ReportingReplica, grpc.aio.Server]]]:
    """`count` replicas on 127.0.0.1, by address."""
    running: dict[str, tuple[ReportingReplica, grpc.aio.Server]] = {}
    try:
        for i in range(count):
            replica, server = ReportingReplica(f"replica-{i}"), grpc.aio.server()
            pb_grpc.add_InferenceServiceServicer_to_server(replica, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            running[f"127.0.0.1:{port}"] = (replica, server)
        yield running
    finally:
        for _, server in running.values():
            await server.stop(None)


async def _served(client: InferenceClient, adapter: str, times: int = 6) -> set[str]:
    return {(await client.generate(adapter, "hi")).text for _ in range(times)}


async def _polled(replicas: list[ReportingReplica]) -> None:
    """Waits until every replica has been polled twice since now (a fresh report)."""
    marks = [r.polls for r in replicas]
    await eventually(
        lambda: all(r.polls >= m + 2 for r, m in zip(replicas, marks, strict=True)), "polled"
    )


async def test_an_adapter_spills_to_its_second_replica_when_its_first_reports_a_high_load() -> None:
    async with fleet(3) as running:
        first, second, _ = (running[a][0] for a in preference("alpha", running))
        async with InferenceClient(",".join(running), routing=FAST) as client:
            assert await _served(client, "alpha") == {first.name}
            first.pending = 40
            await _polled([first])
            assert await _served(client, "alpha") == {second.name}


async def test_an_adapter_returns_home_once_its_first_replica_is_within_the_bound() -> None:
    async with fleet(3) as running:
        first = running[preference("alpha", running)[0]][0]
        first.pending = 40
        async with InferenceClient(",".join(running), routing=FAST) as client:
            await _served(client, "warm-up")
            await _polled([first])
            assert first.name not in await _served(client, "alpha")
            first.pending = 0
            await _polled([first])
            assert await _served(client, "alpha") == {first.name}


async def test_a_replica_holding_the_adapter_is_preferred_within_the_bound() -> None:
    async with fleet(3) as running:
        second = running[preference("alpha", running)[1]][0]
        second.resident = ["alpha"]
        async with InferenceClient(",".join(running), routing=FAST) as client:
            await _served(client, "warm-up")
            await _polled([second])
            assert await _served(client, "alpha") == {second.name}


async def test_a_cold_adapter_sharing_a_hot_adapters_replica_moves_there_whole() -> None:
    async with fleet(3) as running:
        home = preference("hot", running)[0]
        cold = next(f"cold-{i}" for i in range(100) if preference(f"cold-{i}", running)[0] == home)
        second = running[preference(cold, running)[1]][0]
        # Even totals (no request over the bound): the move is the placement's alone.
        for replica, _ in running.values():
            replica.pending = 10
        running[home][0].adapters = {"hot": 30, cold: 1}
        placing = BoundedLoad(poll_interval_s=0.02, placement_interval_s=0.05, demand_smoothing=1)
        async with InferenceClient(",".join(running), routing=placing) as client:
            await _served(client, "warm-up")
            await _polled([r for r, _ in running.values()])
            await _polled([r for r, _ in running.values()])
            assert await _served(client, cold, 12) == {second.name}
            assert await _served(client, "hot") == {running[home][0].name}


async def test_a_hot_adapter_spills_by_the_clients_own_count_between_reports() -> None:
    async with fleet(3) as running:
        for replica, _ in running.values():
            replica.hold = asyncio.Event()
        slow = BoundedLoad(poll_interval_s=60)
        async with InferenceClient(",".join(running), routing=slow) as client:
            streams = [client.stream("alpha", "hi") for _ in range(9)]
            firsts = [await anext(stream) for stream in streams]
            for replica, _ in running.values():
                assert replica.hold is not None
                replica.hold.set()
            for stream in streams:
                await stream.aclose()  # type: ignore[attr-defined]
    spread = {delta.text for delta in firsts}
    assert len(spread) > 1, spread


async def test_a_stopped_replicas_adapters_go_to_another_without_a_failure() -> None:
    async with fleet(3) as running:
        home = preference("alpha", running)[0]
        async with InferenceClient(",".join(running), routing=FAST, retry=RETRY) as client:
            await _served(client, "alpha")
            await running[home][1].stop(None)
            served = await _served(client, "alpha")
    assert served
    assert running[home][0].name not in served


@pytest.mark.parametrize(("unanswered_s", "stays"), [(60.0, True), (0.1, False)])
async def test_a_replica_answering_its_polls_late_keeps_its_adapters_until_unanswered_s(
    unanswered_s: float, stays: bool
) -> None:
    policy = BoundedLoad(poll_interval_s=0.02, poll_timeout_s=0.05, unanswered_s=unanswered_s)
    async with fleet(3) as running:
        home = running[preference("alpha", running)[0]][0]
        async with InferenceClient(",".join(running), routing=policy) as client:
            await _served(client, "alpha")
            home.answers_after = 1.0
            # Several polls timed out meanwhile.
            await asyncio.sleep(0.5)
            assert (await _served(client, "alpha") == {home.name}) is stays


async def test_a_replica_without_load_reports_keeps_its_adapters() -> None:
    async with fleet(3) as running:
        for replica, _ in running.values():
            replica.reports = False
        home = running[preference("alpha", running)[0]][0]
        async with InferenceClient(",".join(running), routing=FAST) as client:
            await _served(client, "warm-up")
            await _polled([home])
            assert await _served(client, "alpha") == {home.name}


@asynccontextmanager
async def _replica_set(
    running: dict[str, tuple[ReportingReplica, grpc.aio.Server]], smoothing: float = 1
) -> AsyncIterator[ReplicaSet]:
    """A replica set over `running`, by default taking every report whole."""
    policy = BoundedLoad(poll_interval_s=0.02, demand_smoothing=smoothing)
    replicas = ReplicaSet(None, list(running), grpc.aio.insecure_channel, policy)
    try:
        await replicas.start()
        yield replicas
    finally:
        await replicas.close()


async def _reported(running: dict[str, tuple[ReportingReplica, grpc.aio.Server]]) -> None:
    """Waits until a fresh report of every replica is taken."""
    await _polled([r for r, _ in running.values()])


def _queued_and_quick(replica: ReportingReplica) -> None:
    """One adapter asked for once a second, its requests queued long; another asked for
    three times as often, its requests quick."""
    replica.pending, replica.adapters = 12, {"queued": 9, "quick": 3}
    replica.rates = {"queued": 1.0, "quick": 3.0}


async def test_an_adapters_demand_is_its_share_of_admissions_times_the_pending_sequences() -> None:
    async with fleet(1) as running, _replica_set(running) as replicas:
        _queued_and_quick(next(iter(running.values()))[0])
        await _reported(running)
        demand = replicas.demand
    assert demand == pytest.approx({"queued": 3.0, "quick": 9.0})


async def test_demand_is_pending_sequences_while_a_replica_does_not_report_admissions() -> None:
    async with fleet(2) as running, _replica_set(running) as replicas:
        (reporting, _), (older, _) = running.values()
        _queued_and_quick(reporting)
        older.pending, older.adapters = 2, {"quick": 2}
        await _reported(running)
        demand = replicas.demand
    assert demand == pytest.approx({"queued": 9.0, "quick": 5.0})


async def test_demand_stays_pending_sequences_while_a_replica_without_admissions_is_idle() -> None:
    async with fleet(2) as running, _replica_set(running) as replicas:
        (reporting, _), (older, _) = running.values()
        _queued_and_quick(reporting)
        older.pending, older.adapters = 2, {"quick": 2}
        await _reported(running)
        older.pending, older.adapters = 0, {}
        await _reported(running)
        demand = replicas.demand
    assert demand == pytest.approx({"queued": 9.0, "quick": 3.0})


async def test_a_replica_replaced_by_one_that_reports_admissions_is_placed_by_them() -> None:
    async with fleet(1) as running, _replica_set(running) as replicas:
        replica = next(iter(running.values()))[0]
        replica.pending, replica.adapters = 12, {"queued": 9, "quick": 3}
        await _reported(running)
        replica.name = "replica-0-upgraded"
        _queued_and_quick(replica)
        await _reported(running)
        demand = replicas.demand
    assert demand == pytest.approx({"queued": 3.0, "quick": 9.0})


async def test_a_rate_that_is_not_a_finite_positive_number_is_no_demand() -> None:
    async with fleet(1) as running, _replica_set(running) as replicas:
        replica = next(iter(running.values()))[0]
        _queued_and_quick(replica)
        replica.adapters["bad"] = replica.adapters["worse"] = replica.adapters["none"] = 0
        replica.rates.update(bad=math.nan, worse=math.inf, none=-1.0)
        await _reported(running)
        demand = replicas.demand
    assert demand == pytest.approx({"queued": 3.0, "quick": 9.0})


async def test_a_token_count_that_is_not_a_number_is_not_taken() -> None:
    async with fleet(1) as running, _replica_set(running) as replicas:
        replica = next(iter(running.values()))[0]
        _queued_and_quick(replica)
        # Taken (as 1), the queued adapter would weigh 1 against the quick one's 3 x 4;
        # unknown, it counts the 9 places it holds.
        replica.tokens = {"queued": math.nan, "quick": 4.0}
        await _reported(running)
        demand = replicas.demand
    assert demand == pytest.approx({"queued": 9.0, "quick": 3.0})


async def test_tokens_per_sequence_are_taken_within_one_and_the_most_any_model_holds() -> None:
    async with fleet(1) as running, _replica_set(running) as replicas:
        replica = next(iter(running.values()))[0]
        _queued_and_quick(replica)
        replica.tokens = {"queued": -5.0, "quick": 1e300}
        await _reported(running)
        demand = replicas.demand
    work = {"queued": 1.0, "quick": 3.0 * MAX_TOKENS_PER_SEQUENCE}
    assert demand == pytest.approx({a: 12 * w / sum(work.values()) for a, w in work.items()})


async def test_a_client_that_just_started_reads_demand_at_its_full_size() -> None:
    async with fleet(1) as running, _replica_set(running, smoothing=0.02) as replicas:
        _queued_and_quick(next(iter(running.values()))[0])
        await _reported(running)
        demand = replicas.demand
    assert demand == pytest.approx({"queued": 3.0, "quick": 9.0})


class ShuttingDownReplica(ReportingReplica):
    """Ends its first `refusals` Generate calls CANCELLED before any message, as a gRPC
    server shutting down does to calls it had received but not started."""

    def __init__(self, name: str, refusals: int) -> None:
        super().__init__(name)
        self.refusals = refusals

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        if self.refusals > 0:
            self.refusals -= 1
            await context.abort(grpc.StatusCode.CANCELLED, "server shutting down")
        yield pb.GenerateResponse(text=self.name)
        yield pb.GenerateResponse(finish_reason=pb.FINISH_REASON_STOP)


async def test_a_call_the_server_cancelled_before_its_first_message_is_sent_again() -> None:
    replica, server = ShuttingDownReplica("replica-0", refusals=2), grpc.aio.server()
    pb_grpc.add_InferenceServiceServicer_to_server(replica, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with InferenceClient(f"127.0.0.1:{port}", retry=RETRY) as client:
            completion = await client.generate("alpha", "hi")
    finally:
        await server.stop(None)
    assert (completion.text, replica.refusals) == ("replica-0", 0)


async def test_clients_started_apart_first_place_at_the_same_boundary_of_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wall = ManualClock(1000.0)
    monkeypatch.setattr(replicas_module, "time", wall)
    policy = BoundedLoad(poll_interval_s=0.02, placement_interval_s=2.0)
    async with fleet(3) as running:
        for replica, _ in running.values():
            _queued_and_quick(replica)
        first = ReplicaSet(None, list(running), grpc.aio.insecure_channel, policy)
        second = ReplicaSet(None, list(running), grpc.aio.insecure_channel, policy)
        try:
            await first.start()
            await _reported(running)
            wall.now += 1.5
            await second.start()
            await _reported(running)
            assert (first.placement, second.placement) == (None, None)
            wall.now += 0.6
            await _reported(running)
            await _reported(running)
            assert first.placement is not None
            assert first.placement == second.placement
        finally:
            await first.close()
            await second.close()


async def test_a_client_follows_an_adapter_to_where_it_was_admitted_since_it_placed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wall = ManualClock(1000.0)
    monkeypatch.setattr(replicas_module, "time", wall)
    policy = BoundedLoad(poll_interval_s=0.02, placement_interval_s=2.0, demand_smoothing=1)
    async with fleet(3) as running:
        home, elsewhere, _ = preference("alpha", running)
        # Admitted evenly everywhere: it runs mostly nowhere, and is placed home.
        for replica, _ in running.values():
            replica.pending, replica.adapters, replica.rates = 1, {"alpha": 1}, {"alpha": 1.0}
        replicas = ReplicaSet(None, list(running), grpc.aio.insecure_channel, policy)
        try:
            await replicas.start()
            await _reported(running)
            await _next_round(wall, running)
            placed = replicas.placement
            # Then admitted only elsewhere, as where other clients placed it.
            for address, (replica, _) in running.items():
                there = address == elsewhere
                replica.pending = 1 if there else 0
                replica.adapters = {"alpha": 1} if there else {}
                replica.rates = {"alpha": 3.0} if there else {}
            await _next_round(wall, running)
            followed = replicas.placement
        finally:
            await replicas.close()
    assert (placed, followed) == ({"alpha": home}, {"alpha": elsewhere})


async def _next_round(
    wall: ManualClock, running: dict[str, tuple[ReportingReplica, grpc.aio.Server]]
) -> None:
    """Moves the wall clock to the next placement round, and waits until it is placed."""
    wall.now += BoundedLoad().placement_interval_s
    await _reported(running)
    await _reported(running)
