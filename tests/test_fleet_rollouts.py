"""Canary rollouts on every replica of the session's fleet of processes (issue 25;
`process_fleet`, see tests/test_fleet.py): the split's share on every replica, one
revision per caller key on every replica and both fronts, promote and abort applied
everywhere, and the store's guards aborting a candidate one replica refuses or that
errs above the margin, with the status saying why. Runs after
tests/reliability/test_tracing_fleet.py and before tests/test_fleet.py, whose last test
kills a replica."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.testing.adapters.ctl import ctl
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import adapter_files
from loraserve.testing.processes.fleet import (
    FAILING_REVISION,
    SMALL_MAX_RANK,
    Fleet,
    all_serve,
    grpc_codes,
    grpc_revisions,
    http_revisions,
)
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.waiting import FLEET_GUARD_S, eventually

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Keyless requests pick their arm by a golden-ratio sequence, not by chance: any 100 in
# a row put 20 +- 2 of them in a 20 % arm, so 100 per replica tell what 1,000 did.
ROLLOUT_REQUESTS = 100


async def _two_revisions(
    process_fleet: Fleet, tiny_adapter: TinyAdapterFactory, name: str, seed: int, rank: int = 8
) -> None:
    """NAME@1 current on every replica, NAME@2 (of `rank`) pushed without promoting."""
    async with store_stub(process_fleet.stores[0].address) as stub:
        await push(stub, name, adapter_files(tiny_adapter(seed=seed)))
        candidate = tiny_adapter(rank=rank, seed=seed + 1)
        await push(stub, name, adapter_files(candidate), no_promote=True)
    await eventually(
        lambda: all_serve(process_fleet, {name: 1}), f"every replica serves {name}@1", FLEET_GUARD_S
    )


async def _rollout(process_fleet: Fleet, call: str, request: Any) -> store_pb.RolloutResponse:
    """A rollout call through the second store: two replicas follow the first one."""
    async with store_stub(process_fleet.stores[1].address) as stub:
        response: store_pb.RolloutResponse = await getattr(stub, call)(request, timeout=60)
    return response


async def _start(
    process_fleet: Fleet, name: str, weight: float, guards: store_pb.RolloutGuards | None = None
) -> None:
    """Starts the rollout of NAME@2 and waits until every replica splits at `weight`."""
    guards = guards or store_pb.RolloutGuards(abort_on_nack=True)
    request = store_pb.StartRolloutRequest(name=name, revision=2, weight=weight, guards=guards)
    await _rollout(process_fleet, "StartRollout", request)
    await eventually(
        lambda: process_fleet.splits(name, 2, weight),
        f"every replica splits {name} at {weight} %",
        FLEET_GUARD_S,
    )


async def _every_front(process_fleet: Fleet, name: str, keys: list[str]) -> list[list[int]]:
    """The revisions that served `keys` on every replica, over gRPC then over HTTP."""
    return list(
        await asyncio.gather(
            *(grpc_revisions(replica, name, keys) for replica in process_fleet.replicas),
            *(http_revisions(replica, name, keys) for replica in process_fleet.replicas),
        )
    )


async def test_weight_20_sends_20_percent_of_100_requests_to_the_candidate_on_every_replica(
    process_fleet: Fleet, tiny_adapter: TinyAdapterFactory
) -> None:
    await _two_revisions(process_fleet, tiny_adapter, "canary-share", seed=201)
    await _start(process_fleet, "canary-share", 20)
    keys = [""] * ROLLOUT_REQUESTS
    replicas = process_fleet.replicas
    served = await asyncio.gather(*(grpc_revisions(r, "canary-share", keys) for r in replicas))
    candidate = {r.name: Counter(s)[2] for r, s in zip(replicas, served, strict=True)}
    assert all(set(revisions) == {1, 2} for revisions in served)
    assert all(abs(count - 20) <= 2 for count in candidate.values()), candidate


async def test_one_caller_key_gets_one_revision_on_every_replica_and_both_fronts(
    process_fleet: Fleet, tiny_adapter: TinyAdapterFactory
) -> None:
    await _two_revisions(process_fleet, tiny_adapter, "canary-keys", seed=203)
    await _start(process_fleet, "canary-keys", 50)
    keys = [f"user-{i}" for i in range(20)] * 2
    by_key: dict[str, set[int]] = {}
    for revisions in await _every_front(process_fleet, "canary-keys", keys):
        for key, revision in zip(keys, revisions, strict=True):
            by_key.setdefault(key, set()).add(revision)
    assert all(len(revisions) == 1 for revisions in by_key.values()), by_key
    assert set().union(*by_key.values()) == {1, 2}


@pytest.mark.parametrize(("change", "revision"), [("promote", 2), ("abort", 1)])
async def test_once_a_promote_or_abort_is_applied_every_replica_serves_one_revision(
    process_fleet: Fleet, tiny_adapter: TinyAdapterFactory, change: str, revision: int
) -> None:
    """Promote: every request, with a key or without, goes to the candidate on every
    replica and front as soon as the replica has applied the promote's seq; abort: to
    the current revision."""
    name = f"canary-{change}"
    await _two_revisions(
        process_fleet, tiny_adapter, name, seed=205 if change == "promote" else 207
    )
    await _start(process_fleet, name, 50)
    if change == "promote":
        promote = store_pb.PromoteRolloutRequest(name=name, expected_candidate_revision=2)
        ended = await _rollout(process_fleet, "PromoteRollout", promote)
    else:
        ended = await _rollout(
            process_fleet, "AbortRollout", store_pb.AbortRolloutRequest(name=name)
        )
    await eventually(
        lambda: process_fleet.applied(ended.seq), f"seq {ended.seq} applied", FLEET_GUARD_S
    )
    keys = [""] * 50 + [f"user-{i}" for i in range(50)]
    served = await _every_front(process_fleet, name, keys)
    assert all(set(revisions) == {revision} for revisions in served), served


async def _ended_by_guard(process_fleet: Fleet, name: str) -> store_pb.Rollout | None:
    async with store_stub(process_fleet.stores[0].address) as stub:
        response = await stub.GetRollout(store_pb.GetRolloutRequest(name=name), timeout=60)
    rollout: store_pb.Rollout = response.rollout
    return rollout if rollout.state == store_pb.ROLLOUT_STATE_ABORTED else None


async def _status(process_fleet: Fleet, name: str) -> str:
    env = {"ADAPTERSTORE_ADDR": process_fleet.stores[0].address}
    result = await ctl("rollout", "status", name, env=env)
    assert result.code == 0, result.err
    return result.out


async def _all_current_after(process_fleet: Fleet, rollout: store_pb.Rollout) -> None:
    """Once every replica applied the abort, every request goes to @1."""
    await eventually(
        lambda: process_fleet.applied(rollout.update_seq), "abort applied", FLEET_GUARD_S
    )
    served = await asyncio.gather(
        *(grpc_revisions(r, rollout.adapter_name, [""] * 20) for r in process_fleet.replicas)
    )
    assert all(set(revisions) == {1} for revisions in served), served


async def test_a_candidate_one_replica_refuses_aborts_the_rollout_and_status_says_why(
    process_fleet: Fleet, tiny_adapter: TinyAdapterFactory
) -> None:
    name = "canary-rank"
    await _two_revisions(process_fleet, tiny_adapter, name, seed=209, rank=SMALL_MAX_RANK * 2)
    guards = store_pb.RolloutGuards(abort_on_nack=True)
    request = store_pb.StartRolloutRequest(name=name, revision=2, weight=20, guards=guards)
    await _rollout(process_fleet, "StartRollout", request)
    aborted: list[store_pb.Rollout] = []

    async def ended() -> bool:
        aborted[:] = [r for r in [await _ended_by_guard(process_fleet, name)] if r is not None]
        return bool(aborted)

    await eventually(ended, "the guard aborted the rollout", FLEET_GUARD_S)
    status = await _status(process_fleet, name)
    assert "aborted" in status
    assert f"replica replica-2 refused {name}@2" in status
    refusal = f"rank {SMALL_MAX_RANK * 2}, above this engine's max_lora_rank {SMALL_MAX_RANK}"
    assert refusal in status
    await _all_current_after(process_fleet, aborted[0])


async def test_a_candidate_erring_above_the_margin_aborts_the_rollout_and_status_says_why(
    process_fleet: Fleet, tiny_adapter: TinyAdapterFactory
) -> None:
    """Every replica's engine fails each request of FAILING_REVISION (the fleet's
    injected fault); the current revision serves."""
    name = FAILING_REVISION.split("@")[0]
    await _two_revisions(process_fleet, tiny_adapter, name, seed=211)
    # One caller: every request comes keyless from this host's address.
    guards = store_pb.RolloutGuards(
        abort_on_nack=True, max_error_rate_margin=10, min_requests=10, min_callers=1
    )
    await _start(process_fleet, name, 50, guards)
    codes: Counter[str] = Counter()
    aborted: list[store_pb.Rollout] = []

    async def ended() -> bool:
        aborted[:] = [r for r in [await _ended_by_guard(process_fleet, name)] if r is not None]
        if not aborted:
            for replica_codes in await asyncio.gather(
                *(grpc_codes(r, name, 20) for r in process_fleet.replicas)
            ):
                codes.update(replica_codes)
        return bool(aborted)

    await eventually(ended, "the guard aborted the rollout", FLEET_GUARD_S)
    assert set(codes) == {"OK", "UNAVAILABLE"}, codes
    status = await _status(process_fleet, name)
    assert "rollout-guard" in status
    assert "guard max_error_rate_margin: the candidate's error rate 100.0 %" in status
    await _all_current_after(process_fleet, aborted[0])
