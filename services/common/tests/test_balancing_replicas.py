"""The client's bounded-load routing over real gRPC servers standing in for replicas
(loraserve.testing.fakes.replicas): each answers Generate with its own name and
GetReplicaLoad with the load a test sets. An adapter goes to its first replica within
the bound, spills past it, follows a stopped replica's adapters elsewhere, and a call the
server cancelled before its first message is sent again. The demand the replica set
reads from the reports is tested in test_balancing_replicas_demand.py, its placement
rounds in test_balancing_replicas_placement.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from loraserve.clients.balancing import BoundedLoad, preference
from loraserve.clients.inference import InferenceClient, RetryPolicy
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.fakes.replicas import ReportingReplica, fleet
from loraserve.testing.fakes.replicas import polled as _polled

FAST = BoundedLoad(poll_interval_s=0.02)
RETRY = RetryPolicy(max_attempts=10, initial_backoff=0.01, max_backoff=0.05)


async def _served(client: InferenceClient, adapter: str, times: int = 6) -> set[str]:
    return {(await client.generate(adapter, "hi")).text for _ in range(times)}


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
