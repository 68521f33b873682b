"""The suite's engine-start lock (`loraserve.testing.engine.starts`): engine starts share
it, the fleet's start holds it alone, and a start under the fleet's own hold takes
nothing more. Two holds in one process conflict as two workers' would: flock locks an
open file, and each hold opens its own."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from contextlib import AbstractAsyncContextManager
from contextvars import Context
from pathlib import Path

import pytest

from loraserve.testing.engine.starts import engine_starting


@pytest.fixture(autouse=True)
def _one_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"test-{uuid.uuid4().hex}")
    # The lock file in the test's own directory, not the machine's temporary one.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))


async def test_engine_starts_share_the_lock() -> None:
    async with engine_starting():
        inner = asyncio.create_task(_entered(engine_starting()), context=Context())
        assert await asyncio.wait_for(inner, 5)


async def test_a_start_alone_waits_for_the_starts_under_way() -> None:
    shared = engine_starting()
    await shared.__aenter__()
    alone = asyncio.create_task(_entered(engine_starting(alone=True)), context=Context())
    await asyncio.sleep(0.5)
    assert not alone.done()
    await shared.__aexit__(None, None, None)
    assert await asyncio.wait_for(alone, 5)


async def test_starts_wait_while_one_starts_alone() -> None:
    alone = engine_starting(alone=True)
    await alone.__aenter__()
    # Tasks made outside the test's context: other workers' starts, in effect.
    other = asyncio.create_task(_entered(engine_starting()), context=Context())
    await asyncio.sleep(0.5)
    assert not other.done()
    await alone.__aexit__(None, None, None)
    assert await asyncio.wait_for(other, 5)


async def test_a_start_under_the_fleets_hold_takes_nothing_more() -> None:
    async with engine_starting(alone=True):
        assert await asyncio.wait_for(_entered(engine_starting()), 5)


async def _entered(hold: AbstractAsyncContextManager[None]) -> bool:
    async with hold:
        return True
