"""Where the serving thread's CPU goes per streamed message: measured on its CPU clock,
not sampled.

py-spy counts a thread that waits to run as busy. On 2 cores the event loop, preempted
right after it wakes the transport's Tokio thread, reads as time spent in that wake
(a quarter of the loop's samples), and every share beside it shrinks. Here the event-loop
thread's own CPU clock (CLOCK_THREAD_CPUTIME_ID) is read around

- vLLM's `OutputProcessor.process_outputs`, its pass over a step's outputs (detokenizing,
  a `RequestOutput` each, stats), of which
- the pushed sink (`VllmOutputSink.put`): loraserve making and queueing each message;
- the native transport's flush (`NativeFront._flush`): a loop pass's messages into Rust;

and the rest of the thread's time is everything else: ZMQ receive and decode, the
event loop, each request's admission, `add_request` and end. The few outputs that reach a
sink while its request is being added (`engine.pushed.push`) count in the sink, not in
vLLM's part. Each timed call reads the clock twice, a system call each (about 0.5 µs: a
thread's CPU clock has no vDSO path), which the sink and the thread's total include.

`install(path)` runs in the server (bench/front/grpclib_front.py, with
`BENCH_CPU_SPLIT_DIR` set) and appends the cumulative counters as a JSON line every
`DUMP_S`; `per_message(a, b)` turns two lines into microseconds per message.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

DUMP_S = 0.25
ENV = "BENCH_CPU_SPLIT_DIR"
# The counters a line holds besides the time and the counts.
TIMED = ("thread", "outputs", "sink", "flush")


def _timed(counters: dict[str, float], key: str, method: Callable[..., Any]) -> Any:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            counters[key] += time.thread_time() - start
            counters[key + "_calls"] += 1

    return wrapper


def install(path: Path) -> asyncio.Task[None]:
    """Wraps the three at class level and writes the counters to `path` until cancelled;
    called on the event loop's thread, which all three run on."""
    from vllm.v1.engine.output_processor import OutputProcessor

    from loraserve.inference.engine.pushed import VllmOutputSink
    from loraserve.inference.transport.native import NativeFront

    counters = {f"{key}{tail}": 0.0 for key in TIMED[1:] for tail in ("", "_calls")}
    OutputProcessor.process_outputs = _timed(counters, "outputs", OutputProcessor.process_outputs)
    VllmOutputSink.put = _timed(counters, "sink", VllmOutputSink.put)  # type: ignore[method-assign]
    NativeFront._flush = _timed(counters, "flush", NativeFront._flush)  # type: ignore[method-assign]

    async def dump() -> None:
        with path.open("a") as out:
            while True:
                line = {"t": time.monotonic(), "thread": time.thread_time(), **counters}
                out.write(json.dumps(line) + "\n")
                out.flush()
                await asyncio.sleep(DUMP_S)

    return asyncio.get_running_loop().create_task(dump())


def latest(path: Path) -> dict[str, float]:
    """The last whole line the server wrote; {} before the first."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return {}
    for line in reversed(lines):
        try:
            return dict(json.loads(line))
        except ValueError:
            continue
    return {}


def per_message(start: dict[str, float], end: dict[str, float]) -> dict[str, float]:
    """Microseconds of the loop thread's CPU per message between two lines (a message is
    one sink call), split as the module says; {} without both lines or messages."""
    if not start or not end:
        return {}
    messages = end["sink_calls"] - start["sink_calls"]
    if messages <= 0:
        return {}
    spent = {key: (end[key] - start[key]) * 1e6 / messages for key in TIMED}
    return {
        "vllm_outputs_us": spent["outputs"] - spent["sink"],
        "sink_us": spent["sink"],
        "flush_us": spent["flush"],
        "rest_us": spent["thread"] - spent["outputs"] - spent["flush"],
        "thread_us": spent["thread"],
        "messages_per_step": messages / max(end["outputs_calls"] - start["outputs_calls"], 1),
    }
