"""Per-adapter series stay bounded: the real InferenceMetrics on a real registry names at
most K adapters (`--metrics-top-adapters`) and folds the rest into `_other`, re-ranked by
traffic, and no counter series ever goes down. Requests are the metrics' hooks called
as the generator calls them; the clock is a fake one, so re-ranks come when a test says.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from loraserve.inference.app import InferenceApp
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.metrics.adapter_series import OTHER, RERANK_INTERVAL_S
from loraserve.inference.settings import parse_settings
from loraserve.testing.fakes.clock import ManualClock

K = 20
ADAPTERS = [f"adapter-{i:04d}" for i in range(2000)]
PER_ADAPTER = (
    "loraserve_inference_requests_total",
    "loraserve_inference_throttled_requests_total",
    "loraserve_inference_prompt_tokens_total",
    "loraserve_inference_generated_tokens_total",
    "loraserve_inference_adapter_load_failures_total",
)
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def _metrics(top: int = K) -> tuple[InferenceMetrics, ManualClock]:
    clock = ManualClock()
    return InferenceMetrics(CollectorRegistry(), top_adapters=top, clock=clock), clock


def _series(metrics: InferenceMetrics) -> dict[SeriesKey, float]:
    """Every per-adapter counter series now: (sample name, labels) -> value."""
    found = {}
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name in PER_ADAPTER:
                found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def _adapters_of(series: dict[SeriesKey, float], name: str) -> set[str]:
    return {dict(labels)["adapter"] for metric, labels in series if metric == name}


def _request(metrics: InferenceMetrics, adapter: str, n: int = 1) -> None:
    """`n` requests of `adapter` as the generator and the quota gate count them."""
    for i in range(n):
        metrics.tokens(adapter, prompt=3, generated=5)
        metrics.request_finished(adapter, "CANCELLED" if i % 7 == 6 else "OK")
        if i % 11 == 10:
            metrics.request_throttled(adapter, "in_flight")
    if n > 5:
        metrics.adapter_load_failed(adapter)


def _round(metrics: InferenceMetrics, clock: ManualClock, hot: list[str]) -> None:
    """One re-rank interval of traffic: every adapter once, `hot` ones Zipf-heavy."""
    for rank, adapter in enumerate(hot):
        _request(metrics, adapter, max(1, 400 // (rank + 1)))
    for adapter in ADAPTERS:
        _request(metrics, adapter)
    clock.now += RERANK_INTERVAL_S


def _hot(shift: int) -> list[str]:
    return [ADAPTERS[(i + shift) % len(ADAPTERS)] for i in range(3 * K)]


def test_two_thousand_adapters_name_at_most_k_adapters_and_other_per_metric() -> None:
    metrics, clock = _metrics()

    for step in range(8):
        _round(metrics, clock, _hot(step * 37))
        series = _series(metrics)
        for name in PER_ADAPTER:
            adapters = _adapters_of(series, name)
            assert len(adapters) <= K + 1, f"{name}: {len(adapters)} adapters after {step}"

    assert OTHER in _adapters_of(_series(metrics), "loraserve_inference_requests_total")


def test_no_counter_series_goes_down_as_adapters_fall_out_and_rise_again() -> None:
    metrics, clock = _metrics()
    seen: dict[SeriesKey, float] = {}
    fallen: set[str] = set()
    returned: set[str] = set()
    named: set[str] = set()

    for step in range(8):
        # Two hot groups take turns, so each falls out of the top K and rises again.
        _round(metrics, clock, _hot(0 if step % 2 == 0 else 1000))
        series = _series(metrics)
        for key, value in series.items():
            if key in seen:
                assert value >= seen[key], f"{key} went from {seen[key]} to {value}"
            seen[key] = value
        now_named = _adapters_of(series, PER_ADAPTER[0])
        returned |= fallen & now_named
        fallen |= named - now_named
        named = now_named

    # The figures above prove something only if adapters did fall out and rise again.
    assert returned, "no adapter fell out of the top K and rose again"


def test_an_adapter_rising_into_the_top_k_counts_under_its_own_name_from_the_next_rerank() -> None:
    metrics, clock = _metrics(top=2)
    _request(metrics, "steady-a", 3)
    _request(metrics, "steady-b", 2)
    _request(metrics, "rising", 10)
    clock.now += RERANK_INTERVAL_S

    _request(metrics, "rising")
    _request(metrics, "rising")

    requests = {
        dict(labels)["adapter"]: value
        for (name, labels), value in _series(metrics).items()
        if name == "loraserve_inference_requests_total" and dict(labels)["code"] == "OK"
    }
    # The first request after the interval re-ranks, and is counted under the new rank.
    # Nothing moved: what "rising" did before stays in _other, which never went down.
    assert requests["rising"] == 2
    assert "steady-b" not in requests
    assert requests[OTHER] == 9  # its first 10, one of them CANCELLED


def test_the_base_model_and_unresolved_names_keep_their_own_series() -> None:
    metrics, _ = _metrics(top=1)
    _request(metrics, "taken")
    _request(metrics, "")
    _request(metrics, "_unresolved")
    _request(metrics, "folded")

    adapters = _adapters_of(_series(metrics), "loraserve_inference_requests_total")

    assert adapters == {"taken", "_base", "_unresolved", OTHER}


def test_metrics_top_adapters_flag_sets_the_replicas_bound() -> None:
    argv = ["serve", "--model", "m", "--store", "s:1", "--metrics-top-adapters", "7"]
    app = InferenceApp(parse_settings(argv, {}, "r"))

    assert app.metrics.top_adapters == 7
    assert parse_settings(argv[:-2], {}, "r").metrics_top_adapters == 50
    assert (
        parse_settings(argv[:-2], {"INFERENCE_METRICS_TOP_ADAPTERS": "3"}, "r").metrics_top_adapters
        == 3
    )


@pytest.mark.parametrize("value", ["-1", "many"])
def test_a_bad_metrics_top_adapters_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_settings(
            ["serve", "--model", "m", "--store", "s:1", "--metrics-top-adapters", value], {}, "r"
        )
    assert "--metrics-top-adapters" in capsys.readouterr().err
