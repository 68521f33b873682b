"""What the session's vLLM engine has done, by vLLM's own count: the Prometheus
counters its stat logger feeds from every engine step, in this process's default
registry.

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

from prometheus_client import REGISTRY

_GENERATED = "vllm:generation_tokens_total"
_FINISHED = "vllm:request_success_total"


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


def engine_work() -> EngineWork:
    """The engine's totals so far; subtract an earlier reading for what happened since."""
    totals = {_GENERATED: 0.0, _FINISHED: 0.0}
    seen = False
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
                seen = True
    if not seen:
        raise RuntimeError("vLLM's Prometheus counters are not registered: no engine started")
    return EngineWork(int(totals[_GENERATED]), int(totals[_FINISHED]))
