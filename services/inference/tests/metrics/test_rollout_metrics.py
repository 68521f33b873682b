"""Per-revision counts of an adapter in a rollout (issue 25, items 3 and 4): both arms
in Prometheus and in the cumulative counters the store's guards judge, server-side
errors told from a client's own, and nothing kept once the rollout ends; (issue 54,
item 2) pinned requests left out, and each revision's recent distinct callers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from loraserve.common.config.textlimits import MAX_ROLLOUT_CALLERS
from loraserve.inference.metrics.rollout_metrics import RolloutMeter, caller_hash


def test_both_arms_are_counted_by_revision_with_server_errors_apart() -> None:
    meter = RolloutMeter(CollectorRegistry())
    meter.set("alpha", 2)
    meter.finished("alpha", 1, "OK", 0.05, 8)
    meter.finished("alpha", 2, "OK", 0.2, 8)
    meter.finished("alpha", 2, "INTERNAL", None, 0)
    meter.finished("alpha", 2, "CANCELLED", 0.1, 3)
    meter.finished("beta", 1, "OK", 0.05, 8)
    counts = {(c.name, c.revision): c for c in meter.counters()}
    assert sorted(counts) == [("alpha", 1), ("alpha", 2)]
    candidate = counts["alpha", 2]
    assert (candidate.requests, candidate.errors, candidate.generated_tokens) == (3, 1, 11)
    assert candidate.ttft_buckets[-1] == 2
    assert list(candidate.ttft_buckets) == sorted(candidate.ttft_buckets)


def test_the_series_name_each_arm_and_go_when_the_rollout_ends() -> None:
    registry = CollectorRegistry()
    meter = RolloutMeter(registry)
    meter.set("alpha", 2)
    meter.finished("alpha", 1, "OK", 0.05, 8)
    meter.finished("alpha", 2, "OK", 0.2, 8)
    text = generate_latest(registry).decode()
    assert 'adapter="alpha",arm="current",code="OK",revision="1"' in text
    assert 'adapter="alpha",arm="candidate",code="OK",revision="2"' in text
    meter.end("alpha")
    assert 'adapter="alpha"' not in generate_latest(registry).decode()
    assert (meter.active, meter.counters()) == (False, [])


def test_a_pinned_request_is_not_counted() -> None:
    meter = RolloutMeter(CollectorRegistry())
    meter.set("alpha", 2)
    meter.finished("alpha", 2, "OK", 0.05, 8, "alice", split=False)
    meter.finished("alpha", 2, "OK", 0.05, 8, "bob")
    assert [(c.revision, c.requests) for c in meter.counters()] == [(2, 1)]


def test_each_revision_reports_its_most_recent_distinct_callers_bounded() -> None:
    meter = RolloutMeter(CollectorRegistry())
    meter.set("alpha", 2)
    for i in range(MAX_ROLLOUT_CALLERS + 4):
        meter.finished("alpha", 2, "OK", 0.05, 1, f"caller-{i}")
    meter.finished("alpha", 2, "OK", 0.05, 1, "caller-5")
    (counts,) = meter.counters()
    assert len(counts.callers) == MAX_ROLLOUT_CALLERS
    newest = counts.callers[-1]
    assert (newest.caller, newest.last_request) == (
        caller_hash("alpha", 2, "caller-5"),
        counts.requests,
    )
    assert caller_hash("alpha", 2, "caller-0") not in {c.caller for c in counts.callers}
