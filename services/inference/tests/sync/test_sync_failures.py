"""The synchronizer's failed loads against fakes: NACKs with their codes, retries and their waits.

The end-to-end behaviour (real store, real engine) is in tests/test_hot_swap.py.
"""

from __future__ import annotations

import asyncio

import pytest

from loraserve.clients.store import Heartbeat
from loraserve.common.errors import DataLoss, FailedPrecondition, NotFound, Unavailable
from loraserve.common.fleet.reports import ServingState
from loraserve.inference.sync import Synchronizer, SyncSettings
from loraserve.testing.fakes.sync import Harness, running
from loraserve.testing.fakes.sync_store import listing, pushed
from loraserve.testing.waiting import eventually


def slow_retries(h: Harness) -> None:
    h.sync = Synchronizer(
        h.store, h.registry, settings=SyncSettings(initial_backoff_s=600, max_backoff_s=600)
    )


async def test_a_newer_event_cuts_the_wait_before_a_retry_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness(listing(1, ("a", 1)))
    slow_retries(h)
    h.fetcher.failures[("a", 2)] = [Unavailable("engine busy")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await eventually(lambda: "sync.apply_retry name=a" in caplog.text, "a@2 waits to retry")
        h.feed(stream, pushed(3, "a", 3))
        await h.settled(3)
        assert h.registry.current["a"] == 3


async def test_an_event_during_a_failing_load_is_applied_without_waiting() -> None:
    h = Harness(listing(1, ("a", 1)))
    slow_retries(h)
    h.fetcher.failures[("a", 2)] = [Unavailable("engine busy")]
    h.fetcher.gates[("a", 2)] = gate = asyncio.Event()
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await eventually(lambda: ("a", 2) in h.fetcher.calls, "fetch of a@2 started")
        h.feed(stream, pushed(3, "a", 3))
        await eventually(lambda: stream.empty(), "event taken in")
        gate.set()
        await h.settled(3)
        assert h.registry.current["a"] == 3


async def test_incompatible_revision_is_nacked_once_with_its_reason_and_old_keeps_serving() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.registry.install_failures[("a", 2)] = FailedPrecondition("rank 64 above max_lora_rank 16")
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2), Heartbeat(2))
        await h.settled(2)
        await h.reported("a", (1, {1: ServingState.LOADED, 2: ServingState.FAILED}))
        assert h.store.failure_of("a", 2) == (9, "rank 64 above max_lora_rank 16")
        assert h.registry.current["a"] == 1
        assert h.registry.installs.count(("a", 2, True)) == 1


async def test_corrupt_download_is_nacked_with_data_loss() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [DataLoss("sha256 mismatch")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        await eventually(lambda: h.store.failure_of("a", 2) == (15, "sha256 mismatch"), "NACK")
        assert h.registry.current["a"] == 1


async def test_unexpected_load_error_is_nacked_as_internal_and_sync_goes_on() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.registry.install_failures[("a", 2)] = RuntimeError("engine said no")
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2), pushed(3, "b", 1))
        await h.settled(3)
        await eventually(lambda: h.store.failure_of("a", 2) is not None, "NACK of a@2")
        assert h.store.failure_of("a", 2) == (
            13,
            "internal error loading the revision: RuntimeError",
        )
        await h.reported("b", (1, {1: ServingState.LOADED}))
        assert h.registry.current == {"a": 1, "b": 1}


async def test_transient_fetch_failure_is_retried_until_it_loads() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [Unavailable("store down"), Unavailable("store down")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.fetcher.calls.count(("a", 2)) == 3
        assert h.registry.installs.count(("a", 2, True)) == 1
        await h.reported("a", (2, {2: ServingState.LOADED}))


async def test_revision_refused_before_the_registry_saw_it_is_listed_as_failed() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [FailedPrecondition("adapter a@2 has LoRA rank 64")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        assert h.registry.failures == {("a", 2): (9, "adapter a@2 has LoRA rank 64")}
        await eventually(lambda: h.store.failure_of("a", 2) is not None, "NACK of a@2")


async def test_unknown_revision_is_nacked_not_found() -> None:
    h = Harness(listing(1, ("a", 1)))
    h.fetcher.failures[("a", 2)] = [NotFound("no revision a@2")]
    stream = h.store.open_stream()
    async with running(h):
        await h.started()
        h.feed(stream, pushed(2, "a", 2))
        await h.settled(2)
        await eventually(lambda: h.store.failure_of("a", 2) == (5, "no revision a@2"), "NACK")
