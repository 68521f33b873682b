"""Reading one thread's CPU clock, and the split of the serving thread's CPU per
message (bench.front.cpu_split) from the counters the server writes."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench.front import cpu_split
from bench.method.cpu import thread_cpu_seconds


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_thread_clock_counts_that_thread_and_not_its_siblings() -> None:
    main = os.getpid()
    before = thread_cpu_seconds(main)
    sibling = threading.Thread(target=_burn, args=(0.05,))
    sibling.start()
    sibling.join()

    assert thread_cpu_seconds(main) - before < 0.05


def test_another_thread_cpu_time_is_read_below_a_clock_tick() -> None:
    burnt, release = threading.Event(), threading.Event()

    def burn_then_wait() -> None:
        _burn(0.005)
        burnt.set()
        release.wait()  # blocked: the scheduler has its runtime

    thread = threading.Thread(target=burn_then_wait)
    thread.start()
    try:
        burnt.wait()
        time.sleep(0.01)
        assert thread.native_id is not None
        assert thread_cpu_seconds(os.getpid(), thread.native_id) >= 0.005
    finally:
        release.set()
        thread.join()


def _line(t: float, **values: float) -> dict[str, float]:
    line = {
        "t": t,
        "thread": 0.0,
        **{f"{k}{tail}": 0.0 for k in cpu_split.TIMED[1:] for tail in ("", "_calls")},
    }
    line.update(values)
    return line


def test_the_split_is_per_message_and_the_rest_is_what_the_parts_leave() -> None:
    start = _line(0.0)
    end = _line(
        1.0,
        thread=0.010,
        outputs=0.006,
        outputs_calls=10,
        sink=0.002,
        sink_calls=100,
        flush=0.001,
        flush_calls=10,
    )

    split = cpu_split.per_message(start, end)

    assert split["thread_us"] == 100.0
    assert split["vllm_outputs_us"] == 40.0
    assert split["sink_us"] == 20.0
    assert split["flush_us"] == 10.0
    assert split["rest_us"] == 30.0
    assert split["messages_per_step"] == 10.0


def test_no_split_without_messages_or_a_line_to_start_from() -> None:
    assert cpu_split.per_message({}, _line(1.0, sink_calls=5)) == {}
    assert cpu_split.per_message(_line(0.0), _line(1.0)) == {}


def test_the_latest_line_skips_one_the_server_is_still_writing(tmp_path: Path) -> None:
    path = tmp_path / "split.jsonl"
    path.write_text('{"t": 1.0, "thread": 0.5}\n{"t": 2.0, "thr')

    assert cpu_split.latest(path) == {"t": 1.0, "thread": 0.5}
    assert cpu_split.latest(tmp_path / "none.jsonl") == {}
