"""The demand the client's replica set (loraserve.clients.balancing.replicas) reads from
the replicas' load reports: each adapter's share of admissions times the pending
sequences (weighted by its tokens per sequence), pending sequences alone from a replica
that does not report admissions, and nothing from a rate or a token count that is not a
finite positive number."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from loraserve.clients.balancing import BoundedLoad, ReplicaSet
from loraserve.clients.balancing.replicas import MAX_TOKENS_PER_SEQUENCE
from loraserve.testing.fakes.replicas import ReportingReplica, fleet
from loraserve.testing.fakes.replicas import queued_and_quick as _queued_and_quick
from loraserve.testing.fakes.replicas import reported as _reported


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
