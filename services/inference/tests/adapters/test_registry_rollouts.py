"""The registry's rollout arms on a fake engine and cache (issue 25, item 3): requests
for a candidate whose rollout ends while it loads go on, on the current revision."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from loraserve.clients.store import RolloutSplit
from loraserve.common.revisions.names import AdapterRef
from loraserve.inference.adapters import AdapterRegistry
from loraserve.testing.fakes.engine import FakeEngine, FakeFetcher, fake_manifest
from loraserve.testing.waiting import eventually


class _Removing(asyncio.Event):
    """The fake engine's remove_lora gate, counting the removals held at it."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0

    async def wait(self) -> Literal[True]:
        self.held += 1
        try:
            return await super().wait()
        finally:
            self.held -= 1


async def _served(registry: AdapterRegistry) -> int:
    async with registry.acquire(AdapterRef("alpha"), "") as lease:
        return lease.revision


# A waiter that spins without yielding blocks the event loop: only the signal-based
# timeout can end the test then.
@pytest.mark.timeout(60)
async def test_requests_waiting_on_a_candidate_whose_rollout_ended_mid_load_go_on(
    registry: AdapterRegistry, engine: FakeEngine, fetcher: FakeFetcher
) -> None:
    fetcher.publish("alpha", 1)
    fetcher.publish("alpha", 2)
    await registry.install(fake_manifest("alpha", 1), make_current=True)
    registry.set_rollout("alpha", RolloutSplit(fake_manifest("alpha", 2), 100.0, 5))
    fetcher.gate.clear()
    waiting = [asyncio.create_task(_served(registry)) for _ in range(3)]
    await eventually(lambda: ("alpha", 2) in fetcher.fetches, "the candidate's load started")
    registry.end_rollout("alpha")
    engine.removing = removing = _Removing()
    fetcher.gate.set()
    await eventually(lambda: len(engine.add_calls) == 2, "the candidate reached the engine")
    # The waiters' moment of danger: the candidate loaded, its removal not yet done.
    await eventually(lambda: removing.held == 1, "the candidate's removal is under way")
    removing.set()
    served = await asyncio.wait_for(asyncio.gather(*waiting), 30)
    assert len(served) == 3
    assert set(served) <= {1, 2}
    assert await _served(registry) == 1
