"""Rollouts as change-log records (issue 25): each operation one entry folded the same by
every replica, bad input refused with nothing written, on the in-memory blob store; and
(issue 54, item 6) a promote naming the candidate it expects, refused while a live
replica refuses the candidate unless forced."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from loraserve.adapterstore.api.protoconv import replica_report
from loraserve.adapterstore.catalog.model import ChangeType, StoreState
from loraserve.adapterstore.changelog.log import ChangeLog
from loraserve.adapterstore.rollout.changes import rollout_aborted
from loraserve.adapterstore.rollout.records import GUARD_ACTOR, Guards, RolloutState
from loraserve.adapterstore.store import AdapterStore
from loraserve.common.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.adapters.pushes import push
from loraserve.testing.fakes.blobs import MemoryBlobStore
from loraserve.testing.store.statuses import refused, report_request, routed
from loraserve.testing.store.stores import FAST_LOG, StoreFactory

GUARDS = Guards(max_error_rate_margin=5.0)


async def two_revisions(store: AdapterStore, name: str = "alpha") -> None:
    """`name`@1 current, `name`@2 pushed without promoting."""
    await push(store, name, tiny_adapter(seed=1))
    await push(store, name, tiny_adapter(seed=2), no_promote=True)


async def test_a_rollout_start_is_one_log_entry_with_the_candidate(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    result = await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    adapter, _ = await memory_store.get("alpha")
    assert result.seq == memory_store.head_seq == 3
    assert (result.rollout.state, result.rollout.weight) == (RolloutState.ACTIVE, 20.0)
    assert (result.rollout.current_revision, result.candidate.revision) == (1, 2)
    assert adapter.current_revision == 1
    assert adapter.rollout == result.rollout


async def test_every_replica_folds_the_same_rollout_from_the_log(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    store = await open_store(memory_blobs)
    await two_revisions(store)
    await store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    await store.rollouts.set_weight("alpha", 50.0, "ci")
    await store.rollouts.promote("alpha", 2, "ci")
    other = ChangeLog(memory_blobs, FAST_LOG)
    await other.start()
    try:
        folded = other.state.adapters["alpha"]
    finally:
        await other.close()
    mine = store._log.state.adapters["alpha"]
    assert folded.rollout == mine.rollout
    assert (folded.current_revision, folded.rollout and folded.rollout.state) == (
        2,
        RolloutState.PROMOTED,
    )


async def test_a_snapshot_carries_the_rollout(memory_store: AdapterStore) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 5.0, GUARDS, "ci")
    state = memory_store._log.state
    assert StoreState.from_json(state.to_json()).adapters["alpha"].rollout == (
        state.adapters["alpha"].rollout
    )


async def test_promote_makes_the_candidate_current_and_ends_the_rollout(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    result = await memory_store.rollouts.promote("alpha", 2, "ci")
    adapter, current = await memory_store.get("alpha")
    assert (adapter.current_revision, current.revision) == (2, 2)
    assert result.rollout.state is RolloutState.PROMOTED


async def test_abort_keeps_the_current_revision_and_says_why(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    await memory_store.rollouts.abort("alpha", "too slow", "ci")
    view = await memory_store.rollouts.get("alpha")
    adapter, _ = await memory_store.get("alpha")
    assert adapter.current_revision == 1
    assert (view.rollout.state, view.rollout.end_reason) == (RolloutState.ABORTED, "too slow")


async def test_rollout_of_a_revision_that_does_not_exist_is_not_found(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    with pytest.raises(NotFound, match="alpha@7"):
        await memory_store.rollouts.start("alpha", 7, 20.0, GUARDS, "ci")
    assert memory_store.head_seq == 2


async def test_rollout_of_a_deleted_adapter_is_not_found_naming_the_delete(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    await memory_store.delete("alpha", "ci")
    with pytest.raises(NotFound, match="deleted"):
        await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    assert memory_store.head_seq == 3


@pytest.mark.parametrize("weight", [-1.0, 100.5, float("nan"), float("inf")])
async def test_a_weight_outside_0_to_100_is_invalid(
    memory_store: AdapterStore, weight: float
) -> None:
    await two_revisions(memory_store)
    with pytest.raises(InvalidArgument, match="0 to 100"):
        await memory_store.rollouts.start("alpha", 2, weight, GUARDS, "ci")
    await memory_store.rollouts.start("alpha", 2, 0.0, GUARDS, "ci")
    with pytest.raises(InvalidArgument, match="0 to 100"):
        await memory_store.rollouts.set_weight("alpha", weight, "ci")
    assert memory_store.head_seq == 3


async def test_a_second_rollout_of_one_adapter_is_refused(memory_store: AdapterStore) -> None:
    await two_revisions(memory_store)
    await push(memory_store, "alpha", tiny_adapter(seed=3), no_promote=True)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    with pytest.raises(FailedPrecondition, match="already has an active rollout of alpha@2"):
        await memory_store.rollouts.start("alpha", 3, 20.0, GUARDS, "ci")
    assert memory_store.head_seq == 4


async def test_a_rollout_of_the_current_revision_is_refused(memory_store: AdapterStore) -> None:
    await two_revisions(memory_store)
    with pytest.raises(FailedPrecondition, match="current revision already"):
        await memory_store.rollouts.start("alpha", 1, 20.0, GUARDS, "ci")


async def test_promote_after_abort_is_refused_naming_the_abort(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    await memory_store.rollouts.abort("alpha", "bad answers", "ci")
    head = memory_store.head_seq
    with pytest.raises(FailedPrecondition, match="was aborted at seq 4: bad answers"):
        await memory_store.rollouts.promote("alpha", 2, "ci")
    adapter, _ = await memory_store.get("alpha")
    assert (memory_store.head_seq, adapter.current_revision) == (head, 1)


def _delete(store: AdapterStore) -> Awaitable[object]:
    return store.delete("alpha", "ci")


def _rollback(store: AdapterStore) -> Awaitable[object]:
    return store.set_current("alpha", 2, 0, "ci")


def _push_promoting(store: AdapterStore) -> Awaitable[object]:
    return push(store, "alpha", tiny_adapter(seed=9))


@pytest.mark.parametrize("operation", [_delete, _rollback, _push_promoting])
async def test_a_change_of_the_current_revision_during_a_rollout_is_refused(
    memory_store: AdapterStore, operation: Callable[[AdapterStore], Awaitable[object]]
) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    head = memory_store.head_seq
    with pytest.raises(FailedPrecondition, match="active rollout of alpha@2"):
        await operation(memory_store)
    adapter, _ = await memory_store.get("alpha")
    assert (memory_store.head_seq, adapter.current_revision) == (head, 1)
    assert adapter.active_rollout is not None


async def test_a_push_without_promoting_goes_on_during_a_rollout(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    result = await push(memory_store, "alpha", tiny_adapter(seed=9), no_promote=True)
    assert result.revision.revision == 3


async def test_two_guard_aborts_of_one_rollout_commit_one_entry(
    memory_blobs: MemoryBlobStore, open_store: StoreFactory
) -> None:
    first = await open_store(memory_blobs)
    second = await open_store(memory_blobs)
    await two_revisions(first)
    started = await first.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    build = rollout_aborted("alpha", "guard", (), GUARD_ACTOR, start_seq=started.seq)
    changes = await asyncio.gather(first._log.commit(build), second._log.commit(build))
    committed = [c for c in changes if c is not None]
    assert [c.type for c in committed] == [ChangeType.ROLLOUT_CHANGED]
    await second._log.sync()
    assert second.head_seq == first.head_seq == started.seq + 1


async def test_a_retried_start_with_its_key_commits_once(memory_store: AdapterStore) -> None:
    await two_revisions(memory_store)
    first = await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci", key="k-1")
    again = await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci", key="k-1")
    assert (first.seq, again.seq, memory_store.head_seq) == (3, 3, 3)


async def test_promote_of_another_candidate_than_expected_is_aborted_naming_both(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    await push(memory_store, "alpha", tiny_adapter(seed=3), no_promote=True)
    # Someone reviewed alpha@2; meanwhile its rollout was aborted and @3's started.
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    await memory_store.rollouts.abort("alpha", "restarting", "ci")
    await memory_store.rollouts.start("alpha", 3, 20.0, GUARDS, "ci")
    head = memory_store.head_seq
    with pytest.raises(Aborted, match=r"rollout of alpha@3 .* not of alpha@2 as expected"):
        await memory_store.rollouts.promote("alpha", 2, "ci")
    adapter, _ = await memory_store.get("alpha")
    assert (memory_store.head_seq, adapter.current_revision) == (head, 1)


async def test_promote_without_an_expected_candidate_is_invalid(
    memory_store: AdapterStore,
) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    with pytest.raises(InvalidArgument, match="expected_candidate_revision is required"):
        await memory_store.rollouts.promote("alpha", 0, "ci")
    assert memory_store.head_seq == 3


async def _a_replica_refuses_the_candidate(store: AdapterStore) -> None:
    """alpha@2 in a rollout (no guard aborts it on a NACK); replica r2 refuses @2."""
    await two_revisions(store)
    await store.rollouts.start("alpha", 2, 20.0, Guards(abort_on_nack=False), "ci")
    await store.replicas.report(replica_report(report_request("r1", {"alpha": routed(1)})))
    nack = refused(2, "rank 64 exceeds --max-lora-rank 16")
    await store.replicas.report(replica_report(report_request("r2", {"alpha": nack})))


async def test_promote_while_a_live_replica_refuses_the_candidate_is_refused(
    memory_store: AdapterStore,
) -> None:
    await _a_replica_refuses_the_candidate(memory_store)
    with pytest.raises(FailedPrecondition, match=r"replica r2 refused alpha@2: .*rank 64"):
        await memory_store.rollouts.promote("alpha", 2, "ci")
    adapter, _ = await memory_store.get("alpha")
    assert (memory_store.head_seq, adapter.current_revision) == (3, 1)


async def test_a_forced_promote_goes_on_while_a_replica_refuses_the_candidate(
    memory_store: AdapterStore,
) -> None:
    await _a_replica_refuses_the_candidate(memory_store)
    result = await memory_store.rollouts.promote("alpha", 2, "ci", force=True)
    adapter, _ = await memory_store.get("alpha")
    assert (result.rollout.state, adapter.current_revision) == (RolloutState.PROMOTED, 2)


async def test_a_retried_promote_with_its_key_commits_once(memory_store: AdapterStore) -> None:
    await two_revisions(memory_store)
    await memory_store.rollouts.start("alpha", 2, 20.0, GUARDS, "ci")
    first = await memory_store.rollouts.promote("alpha", 2, "ci", key="p-1")
    again = await memory_store.rollouts.promote("alpha", 2, "ci", key="p-1")
    assert (first.seq, again.seq, memory_store.head_seq) == (4, 4, 4)
