"""What the session's vLLM engine has done, by vLLM's own count: the iteration stats its
engine steps report to its stat loggers, summed by a logger of the tests' own
(`count_work`, installed on the session engine; the service drops vLLM's Prometheus
logger once it serves, so its counters cannot be read).

They tell an aborted request from one left to run: a request the server aborts
mid-stream leaves the engine having generated fewer tokens than it asked for and
is never counted as finished (vLLM drops an aborted request's state, so no step
reports it), while a request nobody aborts generates its whole length and is
counted as finished once. The server's own metrics cannot tell the two apart: they
count what the server passed on, and a server that stops reading without aborting
passes on just as little. Nothing else generates on the session engine while a
test runs, so the difference between two readings is that test's work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineWork:
    """Tokens generated and requests finished (run to a stop or their length)."""

    generated_tokens: int
    finished_requests: int

    def __sub__(self, before: EngineWork) -> EngineWork:
        return EngineWork(
            self.generated_tokens - before.generated_tokens,
            self.finished_requests - before.finished_requests,
        )


class _WorkCounter:
    """A vLLM stat logger summing each step's generated tokens and finished requests."""

    def __init__(self) -> None:
        self.installed = False
        self.generated_tokens = 0
        self.finished_requests = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any, *_: Any, **__: Any) -> None:
        if iteration_stats is not None:
            self.generated_tokens += iteration_stats.num_generation_tokens
            self.finished_requests += len(iteration_stats.finished_requests)

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, *_: Any, **__: Any) -> None:
        pass

    def record_admission_rejection(self, *_: Any, **__: Any) -> None:
        pass


_COUNTER = _WorkCounter()


def count_work(llm: Any) -> None:
    """Counts `llm`'s work from now on (the session engine's fixture calls this)."""
    llm.logger_manager.stat_loggers.append(_COUNTER)
    _COUNTER.installed = True


def engine_work() -> EngineWork:
    """The engine's totals so far; subtract an earlier reading for what happened since."""
    if not _COUNTER.installed:
        raise RuntimeError("no engine's work is counted: the session engine is not started")
    return EngineWork(_COUNTER.generated_tokens, _COUNTER.finished_requests)
