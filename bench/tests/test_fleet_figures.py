"""Benchmark 10's failover verdicts: no request may fail before its first token (the
call moves to another replica), and no more may fail mid-stream than the killed replica
held."""

from __future__ import annotations

from collections import Counter

from bench.fleet.failover import failover_figures
from bench.fleet.rig import adapter_shares, same_replica_shares
from bench.load.workload import Record, RunResult
from bench.method.report import Section


def _result(mid_stream: int, before_first: int) -> RunResult:
    ok = [Record("a", 1.0, 1.1, 2.0, 32) for _ in range(20)]
    cut = [Record("a", 1.0, 1.1, 1.5, 5, 0, "UNAVAILABLE") for _ in range(mid_stream)]
    lost = [Record("a", 1.0, 0.0, 1.2, 0, 0, "UNAVAILABLE") for _ in range(before_first)]
    return RunResult([*ok, *cut, *lost])


def _verdicts(section: Section) -> dict[str, str]:
    return {g.figure.split(",")[0]: g.verdict for g in section.goals}


def test_mid_stream_failures_of_the_streams_the_dead_replica_held_are_expected() -> None:
    section = Section(10, "fleet")
    failover_figures(section, _result(mid_stream=3, before_first=0), 1.5, held=4, replicas=3)
    assert _verdicts(section) == {
        "requests failed before their first token": "met",
        "requests failed mid-stream": "met",
    }


def test_more_mid_stream_failures_than_the_dead_replica_held_are_a_miss() -> None:
    section = Section(10, "fleet")
    failover_figures(section, _result(mid_stream=5, before_first=1), 1.5, held=4, replicas=3)
    assert _verdicts(section) == {
        "requests failed before their first token": "missed",
        "requests failed mid-stream": "missed",
    }
    assert section.repeats["failover (InferenceClient)"][0]["held_by_the_killed_replica"] == 4


def test_an_adapter_on_one_replica_per_run_keeps_its_share_when_runs_differ() -> None:
    runs = [
        [Counter(a=10, b=10), Counter(b=10), Counter(c=10)],
        [Counter(b=10), Counter(a=10, b=10), Counter(c=10)],
    ]
    shares = adapter_shares(runs, replicas=3, min_requests=10)
    assert shares["a"] == 1.0
    assert same_replica_shares(runs, replicas=3, min_requests=10)["a"] == 0.5


def test_an_adapter_split_within_a_run_counts_its_top_replica_only() -> None:
    runs = [[Counter(a=15, b=30), Counter(a=5, c=30), Counter(d=30)]]
    assert adapter_shares(runs, replicas=3, min_requests=10)["a"] == 0.75
