"""Per-revision counts of an adapter in a rollout (issue 25, items 3 and 4): both arms
in Prometheus and in the cumulative counters the store's guards judge, server-side
errors told from a client's own, and nothing kept once the rollout ends."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from loraserve.inference.metrics.rollout_metrics import RolloutMeter


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
