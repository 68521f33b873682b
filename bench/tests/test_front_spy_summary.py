"""A py-spy profile's summary counts the event loop waiting in epoll as idle."""

from __future__ import annotations

from pathlib import Path


def test_a_profiled_event_loop_waiting_in_epoll_counts_as_idle(tmp_path: Path) -> None:
    from bench.front import spy_summary

    loop = "main (x.py:1);Runner.run (asyncio/runners.py:118);run_forever (loop.c:1)"
    profile = tmp_path / "profile.txt"
    profile.write_text(
        f"{loop};epoll_pwait (libc.so.6) 7\n"
        f"{loop};process_outputs (vllm/v1/engine/output_processor.py:700) 3\n"
    )
    summary = spy_summary.summarize(profile)
    assert summary.splitlines()[0] == "10 samples, 3 of them the event loop busy"
    assert "epoll_pwait" not in summary
