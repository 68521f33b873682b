"""The synchronizer applying rollout events against fakes (issue 25, item 3): the split
set at its seq, the candidate loaded ahead on a replica that holds the adapter and
reported as the candidate, a candidate that cannot run here reported FAILED, and the
split ended by an abort or a delete.

The end to end behaviour (real store, real engine) is in tests/test_rollout.py.
"""

from __future__ import annotations

from loraserve.clients.store import EventKind, RolloutSplit, StoreEvent
from loraserve.common.fleet.reports import ServingState
from loraserve.testing.fakes.sync import Harness, running
from loraserve.testing.fakes.sync_store import deleted, listing, manifest, pushed, rollout


async def test_rollout_start_splits_loads_the_candidate_and_reports_it() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False), rollout(3, "a", 2, 1, 20.0))
        await h.settled(3)
        assert h.registry.split_of("a") == RolloutSplit(manifest("a", 2), 20.0, 3)
        assert h.registry.candidates_installed == [("a", 2)]
        await h.reported("a", (1, {1: ServingState.LOADED, 2: ServingState.LOADED}))
        report = h.store.reported("a")
        assert report is not None
        assert [r.candidate for r in report.revisions] == [False, True]


async def test_candidate_that_cannot_run_here_is_reported_failed_and_its_seq_applied() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    big = manifest("a", 2, rank=64)
    start = StoreEvent(3, EventKind.ROLLOUT_CHANGED, "a", big, 1, RolloutSplit(big, 20.0, 3))
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False), start)
        await h.settled(3)
        await h.reported("a", (1, {1: ServingState.LOADED, 2: ServingState.FAILED}))
        assert h.store.failure_of("a", 2) == (9, "rank 64 exceeds --max-lora-rank 16")
        assert h.registry.current["a"] == 1


async def test_abort_ends_the_split_and_the_candidate_leaves_the_report() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False), rollout(3, "a", 2, 1, 20.0))
        await h.settled(3)
        h.feed(stream, rollout(4, "a", 2, 1, None, start_seq=3))
        await h.settled(4)
        assert h.registry.split_of("a") is None
        await h.reported("a", (1, {1: ServingState.LOADED}))


async def test_delete_during_a_rollout_drops_the_split() -> None:
    h = Harness(listing(1, ("a", 1)))
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2, promote=False), rollout(3, "a", 2, 1, 20.0))
        await h.settled(3)
        h.feed(stream, deleted(4, "a"))
        await h.settled(4)
        assert h.registry.split_of("a") is None
        await h.reported("a", None)
