"""The client's replica set (loraserve.clients.balancing.replicas) places adapters in
rounds on the boundaries of the wall clock, so that clients started apart place at the
same moment, and follows an adapter to where it was admitted since it placed it."""

from __future__ import annotations

import grpc
import pytest

from loraserve.clients.balancing import BoundedLoad, ReplicaSet, preference
from loraserve.clients.balancing import replicas as replicas_module
from loraserve.testing.fakes.clock import ManualClock
from loraserve.testing.fakes.replicas import ReportingReplica, fleet
from loraserve.testing.fakes.replicas import queued_and_quick as _queued_and_quick
from loraserve.testing.fakes.replicas import reported as _reported


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
