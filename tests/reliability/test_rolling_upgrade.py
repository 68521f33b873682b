"""Issue 58: a rolling upgrade from the previous release, on one bucket, on real parts.

The previous release (`[tool.loraserve.compat] previous-release`, installed by
`loraserve.testing.releases`) runs a store, S1, and a replica, R1, on S1. Today's code
starts a store, S2, on the same bucket; changes then go through both stores,
interleaved (pushes, a push retried through the other store, a rollback, a rollout
started and promoted), while a watch on each store follows them from seq 0. Today's
replica, R2, starts on S2; then, as a platform team upgrades, R1 and then S1 are
SIGTERMed while a closed-loop client generates on both replicas.

One module fixture runs the upgrade and records what each party saw; each test checks
one promise of it, the change log read straight from the bucket. Only two engines
start in the whole module (R1's and R2's, most of a minute each on a loaded machine),
so every guard is generous and only stops a hung test.
"""

from __future__ import annotations

import sys
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import adapter_files
from loraserve.testing.processes.services import store_process
from loraserve.testing.releases import Release, previous_release
from loraserve.testing.rolling_upgrade import (
    GUARD_S,
    HEAD_STORE_FLAGS,
    HELD_TOKENS,
    NEW,
    OLD,
    STORE_FLAGS,
    A,
    B,
    Upgrade,
    alone_on_the_bucket,
    applied,
    converged,
    old_release_stopped_under_load,
    replica_process,
    rolled_back,
    served_once_current,
    snapshot_formats,
    watched_changes,
)
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.upgrading import log_entries
from loraserve.testing.waiting import eventually

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(1200)]

# Each intended change's idempotency key, sent once (B1's also on its retry).
KEYS = ("a1", "a2", "b1", "a-rollback", "b2", "b-rollout-start", "b-rollout-promote")


@pytest.fixture(scope="session")
def previous(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Release:
    """The previous release, installed once per session (per xdist worker: each has its
    own temporary directory)."""
    return previous_release(pytestconfig.rootpath, tmp_path_factory.mktemp("previous-release"))


@pytest.fixture(scope="module")
async def upgrade(
    previous: Release,
    module_s3_bucket: S3Bucket,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> Upgrade:
    seen, bucket = Upgrade(), module_s3_bucket
    directory = tmp_path_factory.mktemp("rolling-upgrade")
    old = str(previous.python)
    async with AsyncExitStack() as stack:
        s1 = await stack.enter_async_context(
            store_process(bucket, directory / "s1-old.log", extra=STORE_FLAGS, python=old)
        )
        r1 = await stack.enter_async_context(
            replica_process(tiny_model_dir, s1, directory, "r1-old", old)
        )
        async with store_stub(s1.address) as stub:
            await push(stub, A, adapter_files(tiny_adapter(seed=1)), idempotency_key="a1")
        seen.served_by_old_replica = await served_once_current(r1, A, 1)
        s2 = await stack.enter_async_context(
            store_process(bucket, directory / "s2-new.log", extra=(*STORE_FLAGS, *HEAD_STORE_FLAGS))
        )
        await watched_changes(seen, s1, s2, tiny_adapter)
        await eventually(lambda: applied(r1, seen.head), "R1 applied every change", GUARD_S)
        r2 = await stack.enter_async_context(
            replica_process(tiny_model_dir, s2, directory, "r2-new", sys.executable)
        )
        await eventually(lambda: applied(r2, seen.head), "R2 applied every change", GUARD_S)
        await old_release_stopped_under_load(seen, r1, s1, r2)
        await converged(seen, r2)
        seen.log = log_entries(bucket)
        seen.snapshots = snapshot_formats(bucket)
        await alone_on_the_bucket(seen, s2, bucket, tiny_adapter)
        await rolled_back(seen, s2, bucket, old, directory)
    return seen


# -- the tests ------------------------------------------------------------------------


async def test_the_old_replica_serves_a_push_made_through_the_old_store(
    upgrade: Upgrade,
) -> None:
    assert upgrade.served_by_old_replica == 1


async def test_a_push_retried_through_the_other_release_answers_its_first_commit(
    upgrade: Upgrade,
) -> None:
    first, retried = upgrade.replayed
    assert retried == first > 0


async def test_watches_on_both_releases_see_every_change_once_in_seq_order_alike(
    upgrade: Upgrade,
) -> None:
    old, new = upgrade.watched[OLD], upgrade.watched[NEW]
    assert [event[0] for event in new] == list(range(1, upgrade.head + 1)), new
    assert old == new


async def test_no_request_fails_before_its_first_token_while_the_old_release_stops(
    upgrade: Upgrade,
) -> None:
    load = upgrade.load
    assert load.failed_before_first_token == []
    assert load.served[OLD] > 0, load


async def test_requests_that_got_a_first_token_finish_across_the_sigterms(
    upgrade: Upgrade,
) -> None:
    assert upgrade.load.failed_after_first_token == []
    assert upgrade.held == [HELD_TOKENS, HELD_TOKENS]


async def test_the_old_replica_and_store_exit_cleanly_on_sigterm(upgrade: Upgrade) -> None:
    assert upgrade.exit_codes == {OLD + " replica": 0, OLD + " store": 0}


async def test_the_log_holds_each_seq_from_1_to_the_head_once(upgrade: Upgrade) -> None:
    assert [entry["seq"] for entry in upgrade.log] == list(range(1, upgrade.head + 1))


async def test_every_commit_id_in_the_log_is_unique(upgrade: Upgrade) -> None:
    ids = [entry["commit_id"] for entry in upgrade.log]
    assert len(set(ids)) == len(ids) == upgrade.head, ids


async def test_each_idempotency_key_is_committed_once(upgrade: Upgrade) -> None:
    keys = Counter(entry.get("request_key", "") for entry in upgrade.log)
    assert keys == Counter(KEYS)


async def test_revisions_of_each_adapter_are_numbered_without_gaps_or_repeats(
    upgrade: Upgrade,
) -> None:
    pushed: dict[str, list[int]] = {}
    for entry in upgrade.log:
        if entry["type"] == "revision_pushed":
            pushed.setdefault(entry["adapter_name"], []).append(entry["revision"]["revision"])
    assert pushed == {A: [1, 2], B: [1, 2]}


async def test_the_new_replica_applies_the_head_and_serves_the_current_revisions(
    upgrade: Upgrade,
) -> None:
    current = {A: 1, B: 2}
    assert (upgrade.replica_seq, upgrade.serving, upgrade.generated) == (
        upgrade.head,
        current,
        current,
    )


async def test_every_snapshot_written_while_the_old_release_ran_is_in_its_format(
    upgrade: Upgrade,
) -> None:
    # Today's store committed seq 2 (A@2), so it wrote a snapshot in this window too.
    assert 2 in upgrade.snapshots
    assert set(upgrade.snapshots.values()) == {1}, upgrade.snapshots


async def test_todays_store_alone_on_the_bucket_writes_the_newer_format(
    upgrade: Upgrade,
) -> None:
    assert upgrade.snapshots_alone
    assert set(upgrade.snapshots_alone.values()) == {2}, upgrade.snapshots_alone


async def test_the_old_store_refuses_todays_snapshots_without_serving_or_writing(
    upgrade: Upgrade,
) -> None:
    assert not upgrade.old_store_served_on_format_2
    assert "snapshot" in upgrade.old_store_said
    assert upgrade.log_after_refusal == upgrade.final_head


async def test_the_old_store_serves_again_once_todays_store_writes_the_old_format(
    upgrade: Upgrade,
) -> None:
    assert upgrade.old_store_seq_after_rewrite == upgrade.final_head
