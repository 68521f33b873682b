"""The steady-state load: what a window counts, how failures and the requests cut at the
end are told apart, the thin path to an engine, and the load generator in its own
process (driving a stub engine behind bench.load.thin: no vLLM needed)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from bench.load import thin
from bench.load.drive import Load, Timing, drive
from bench.load.loadclient import Arm, LoadGenerator, Window
from bench.load.targets import Target
from bench.load.workload import Record, Workload

TOKEN_S = 0.005


async def _tokens(
    adapter: str, prompt: Sequence[int], max_tokens: int
) -> AsyncIterator[tuple[int, int]]:
    """A stub engine: one token every TOKEN_S; adapter "bad" fails after two."""
    for i in range(max_tokens):
        await asyncio.sleep(TOKEN_S)
        if adapter == "bad" and i == 2:
            raise RuntimeError("engine died")
        yield 1, 7


WORK = Workload(("a", "b"), concurrency=4, requests=16, max_tokens=10)


async def test_every_request_submitted_in_the_window_is_answered_and_none_is_a_failure() -> None:
    figures = await drive(WORK, Load("closed", concurrency=4), Timing(0.1, 0.3), _tokens, {})
    start, stop = figures["window"]
    records = [Record(**r) for r in figures["records"]]
    submitted = [r for r in records if start <= r.submitted < stop]
    assert submitted
    assert all(r.first_token and not r.error for r in submitted)
    assert figures["unfinished"] == 0
    assert figures["failures_outside"] == 0
    assert figures["tokens"] <= sum(r.tokens for r in records)
    assert {"client"} == set(figures["cpu_s"])


async def test_closed_loop_streams_start_one_after_another_over_the_warmup() -> None:
    figures = await drive(WORK, Load("closed", concurrency=4), Timing(0.2, 0.2), _tokens, {})
    window = Window.from_reply(figures)
    # Streams started together would finish together; staggered ones end apart.
    ends = sorted({round(r.finished, 3) for r in window.records if r.finished})
    assert len(ends) > 1


async def test_a_failed_request_is_counted_not_raised() -> None:
    work = Workload(("bad",), concurrency=2, requests=4, max_tokens=10)
    figures = await drive(work, Load("closed", concurrency=2), Timing(0.05, 0.2), _tokens, {})
    window = Window.from_reply(figures)
    assert window.failures > 0
    assert all("engine died" in r.error for r in window.records if r.error)


async def test_an_open_loop_sends_requests_whatever_is_in_flight() -> None:
    figures = await drive(WORK, Load("poisson", rate=200.0), Timing(0.05, 0.2), _tokens, {})
    window = Window.from_reply(figures)
    assert window.records
    assert window.failures == 0


def _window(records: list[Record], unfinished: int = 0) -> Window:
    return Window(
        seconds=10.0,
        tokens=500,
        records=records,
        itl={"p50": 0.02, "p90": 0.03, "p99": 0.05, "max": 0.08, "n": 400},
        cpu_s={"front": 2.0, "client": 1.0},
        unfinished=unfinished,
        start=100.0,
    )


def test_a_window_takes_ttft_from_requests_submitted_in_it_and_e2e_from_those_ended_in_it() -> None:
    records = [
        Record("a", 95.0, 95.5, 101.0, 64),  # warm-up request that ended inside
        Record("a", 102.0, 102.1, 104.0, 64),
        Record("a", 109.0, 109.3, 0.0, 10),  # submitted inside, cut at the end
    ]
    window = _window(records)
    assert window.ttft_p(50) == pytest.approx(0.2)
    assert window.e2e_p(100) == pytest.approx(6.0)
    assert window.tokens_per_s == 50.0
    assert window.cpu_per_1k("front") == pytest.approx(4.0)
    assert window.metric("itl_p99_ms") == pytest.approx(50.0)
    assert window.failures == 0


def test_requests_never_answered_count_as_failures() -> None:
    assert _window([Record("a", 101.0, error="boom")], unfinished=2).failures == 3


async def test_the_thin_path_streams_counts_and_reports_engine_errors() -> None:
    server, port = await thin.serve(_tokens)
    client = thin.ThinClient(f"127.0.0.1:{port}")
    try:
        counts = [c async for c, _ in client.stream("a", [1, 2], 5)]
        assert counts == [1] * 5
        with pytest.raises(thin.ThinError, match="engine died"):
            async for _ in client.stream("bad", [1], 5):
                pass
        # The connection is reused after a complete or failed stream.
        assert [c async for c, _ in client.stream("b", [3], 2)] == [1, 1]
    finally:
        await client.close()
        server.close()


async def test_the_load_generator_runs_in_its_own_process(tmp_path: Path) -> None:
    server, port = await thin.serve(_tokens)
    try:
        async with LoadGenerator(tmp_path) as gen:
            assert gen.pid != os.getpid()
            arm = Arm(
                "stub",
                Target("thin", f"127.0.0.1:{port}"),
                WORK,
                Load("closed", concurrency=4),
                (("front", os.getpid()),),
            )
            window = await gen.run(arm, Timing(0.2, 0.5))
    finally:
        server.close()
    assert window.tokens > 0
    assert window.failures == 0
    # The stub engine ran in this process: its CPU is the "front" the arm watched.
    assert window.cpu_s["front"] > 0
    assert window.cpu_s["client"] > 0


def test_an_arm_over_several_servers_sums_their_front_processes() -> None:
    window = _window([])
    window.cpu_s = {"front": 2.0, "front_1": 1.0, "client": 1.0, "frontier": 9.0}
    assert window.cpu_per_1k("front") == pytest.approx(6.0)
    assert window.cpu_per_1k("client") == pytest.approx(2.0)
