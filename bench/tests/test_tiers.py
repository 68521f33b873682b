"""Benchmark 11's bookkeeping: the replica's metrics as it exports them, the Zipf
traffic, the order of the arms, the bytes on disk, the seeding through the push API,
and every verdict computed from the figures."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import grpc
import pytest

from bench.load.loadclient import Window
from bench.load.workload import Record, Workload
from bench.method.paired import Runs
from bench.method.report import Section
from bench.rig import storeops
from bench.tiers.figures import (
    FirstRequest,
    Start,
    cold_ttft_figures,
    disk_figures,
    rotated,
    rss_after_figures,
    rss_goal,
    singleflight_figures,
    start_order,
    startup_figures,
    throughput_figures,
    tier_table,
)
from bench.tiers.rig import (
    DOWNLOADS,
    DiskUse,
    MissingMetric,
    adapter_name,
    disk_use,
    metric,
    metric_or_nan,
    parse_metrics,
    seed,
)
from loraserve.adapterstore.v1 import adapterstore_pb2 as store_pb
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.store.server import RunningStore

EXPOSITION = """\
# HELP loraserve_inference_adapter_downloads_total Revisions fetched from the store.
# TYPE loraserve_inference_adapter_downloads_total counter
loraserve_inference_adapter_downloads_total 7.0
# HELP loraserve_inference_adapter_misses_total Requests that found their adapter absent.
# TYPE loraserve_inference_adapter_misses_total counter
loraserve_inference_adapter_misses_total{tier="engine"} 5.0
loraserve_inference_adapter_misses_total{tier="disk"} 3.0
# HELP loraserve_inference_adapter_load_seconds Time a request waited for a load.
# TYPE loraserve_inference_adapter_load_seconds histogram
loraserve_inference_adapter_load_seconds_bucket{le="0.1",source="store"} 1.0
loraserve_inference_adapter_load_seconds_bucket{le="+Inf",source="store"} 3.0
loraserve_inference_adapter_load_seconds_count{source="store"} 3.0
loraserve_inference_adapter_load_seconds_sum{source="store"} 0.6
# HELP loraserve_inference_adapter_cache_bytes Bytes of adapter files on disk.
# TYPE loraserve_inference_adapter_cache_bytes gauge
loraserve_inference_adapter_cache_bytes 1.048576e+06
"""


def test_metrics_are_read_by_name_and_labels() -> None:
    samples = parse_metrics(EXPOSITION)

    assert metric(samples, DOWNLOADS) == 7
    assert metric(samples, "loraserve_inference_adapter_misses_total") == 8
    assert metric(samples, "loraserve_inference_adapter_misses_total", tier="disk") == 3
    assert metric(samples, "loraserve_inference_adapter_cache_bytes") == 2**20
    assert metric(samples, "loraserve_inference_adapter_load_seconds_count", source="store") == 3


def test_a_metric_the_replica_does_not_export_is_an_error_naming_it() -> None:
    samples = parse_metrics(EXPOSITION)

    with pytest.raises(MissingMetric, match="loraserve_inference_adapter_evictions_total"):
        metric(samples, "loraserve_inference_adapter_evictions_total")
    assert metric_or_nan(samples, "loraserve_inference_adapter_evictions_total") != 0


def test_zipf_traffic_is_fixed_by_its_seed_and_favours_the_head() -> None:
    names = tuple(adapter_name(i) for i in range(2000))
    workload = Workload(names, concurrency=32, requests=2000, max_tokens=8, popularity="zipf:1.1")

    schedule = workload.schedule()
    counts = Counter(adapter for adapter, _ in schedule)

    assert schedule == workload.schedule()
    assert schedule != Workload(**{**workload.to_json(), "adapters": names, "seed": 1}).schedule()
    assert counts.most_common(1)[0][0] == names[0]
    # Zipf(1.1) over 2,000: about 4/5 of requests to the top 200, a long tail of the rest.
    top = sum(counts[n] for n in names[:200])
    assert 0.7 < top / len(schedule) < 0.9
    assert len(counts) > 300


def test_both_zipf_arms_send_the_same_prompts_with_the_same_seed() -> None:
    names = tuple(adapter_name(i) for i in range(2000))
    many = Workload(names, concurrency=8, requests=64, max_tokens=8, popularity="zipf:1.1", seed=2)
    few = Workload(
        names[:32], concurrency=8, requests=64, max_tokens=8, popularity="zipf:1.1", seed=2
    )

    assert [p for _, p in many.schedule()] == [p for _, p in few.schedule()]


@pytest.mark.parametrize("repeats", [1, 2, 3, 4])
def test_starts_alternate_and_end_on_the_big_store(repeats: int) -> None:
    order = start_order("few", "many", repeats)

    pairs = [order[i : i + 2] for i in range(0, len(order), 2)]
    assert all(sorted(pair) == ["few", "many"] for pair in pairs)
    assert order[-1] == "many"
    if repeats > 1:
        assert pairs[0] != pairs[1]


def test_arm_order_rotates_each_repeat() -> None:
    assert [rotated(["a", "b", "c"], rep) for rep in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_disk_use_counts_a_linked_file_once_and_no_symlinks(tmp_path: Path) -> None:
    (tmp_path / "rev1").mkdir()
    (tmp_path / "rev1" / "weights").write_bytes(b"x" * 1000)
    (tmp_path / "rev1" / ".manifest.json").write_bytes(b"m" * 7)
    (tmp_path / ".index.json").write_bytes(b"y" * 10)
    os.link(tmp_path / "rev1" / "weights", tmp_path / "hardlink")
    (tmp_path / "symlink").symlink_to(tmp_path / "rev1" / "weights")

    assert disk_use(tmp_path) == DiskUse(total=1017, dotfiles=17)


def _goal(section: Section) -> tuple[str, bool | None]:
    goal = section.goals[-1]
    return goal.value, goal.met


def _starts(seconds: list[float], rss: list[float]) -> list[Start]:
    return [Start(s, r) for s, r in zip(seconds, rss, strict=True)]


def test_startup_and_rss_ratios_pair_the_starts() -> None:
    section = Section(11, "tiers")
    few = (
        "20 adapters",
        _starts([20.0, 30.0, 21.0, 20.0, 22.0], [1000.0, 1010.0, 990.0, 1000.0, 1000.0]),
    )
    many = (
        "2,000 adapters",
        _starts([21.0, 31.0, 22.0, 21.0, 23.0], [1010.0, 1020.0, 1000.0, 1010.0, 1010.0]),
    )

    startup_figures(section, few, many)
    assert section.goals[-1].verdict == "met"
    assert section.goals[-1].value.startswith("1.05 [")
    rss_goal(section, few, many)
    assert section.goals[-1].verdict == "met"
    assert [r["seconds"] for r in section.repeats["2,000 adapters"]] == [
        21.0,
        31.0,
        22.0,
        21.0,
        23.0,
    ]

    slow = ("2,000 adapters", _starts([30.0, 40.0, 30.0, 30.0, 31.0], [1300.0] * 5))
    startup_figures(section, few, slow)
    assert section.goals[-1].verdict == "missed"
    rss_goal(section, few, slow)
    assert section.goals[-1].verdict == "missed"


def test_rss_after_the_traffic_is_compared_with_rss_once_serving() -> None:
    section = Section(11, "tiers")
    rss_after_figures(section, 1000.0, [1050.0, 1060.0, 1040.0, 1055.0, 1050.0], 198.0)
    goal = section.goals[-1]
    assert "host tier: 198 adapters" in goal.figure
    assert (goal.value.split(" [")[0], goal.verdict) == ("1.05", "met")
    rss_after_figures(section, 1000.0, [1300.0] * 5, 198.0)
    assert section.goals[-1].verdict == "missed"


def _request(adapter: str, ttft_s: float, error: str = "") -> Record:
    return Record(adapter, 100.0, 100.0 + ttft_s, 100.0 + ttft_s + 0.01, 4, 1, error)


def test_cold_ttft_counts_only_adapters_their_first_request_downloaded() -> None:
    section = Section(11, "tiers")
    cold = [FirstRequest(_request(a, 0.30 + i * 0.01), 1) for i, a in enumerate("abcde")]
    cold.append(FirstRequest(_request("f", 0.05), 0))  # prefetched: no download
    warm = [FirstRequest(_request(a, 0.2), 0) for a in "abcdef"]

    cold_ttft_figures(section, cold, warm)

    added = next(g for g in section.goals if g.figure.startswith("first request"))
    assert added.value.startswith("120 [")
    assert added.estimate is not None
    assert added.estimate.n == 5
    assert added.verdict == "met"
    assert any("1 of the 6 adapters" in note for note in section.notes)


def test_cold_ttft_misses_its_goal_when_loading_is_slow_and_counts_failures() -> None:
    warm = [FirstRequest(_request(a, 0.2), 0) for a in "abcde"]
    slow = Section(11, "tiers")
    cold_ttft_figures(slow, [FirstRequest(_request(a, 0.40), 1) for a in "abcde"], warm)
    assert next(g for g in slow.goals if g.figure.startswith("first request")).verdict == "missed"

    failed = Section(11, "tiers")
    cold = [
        FirstRequest(_request("a", 0.3), 1),
        FirstRequest(_request("b", 0.0, "AioRpcError: DEADLINE_EXCEEDED"), 0),
    ]
    cold_ttft_figures(failed, cold, warm[:2])
    check = next(g for g in failed.goals if g.figure.startswith("failed single"))
    assert (check.value, check.verdict) == ("1", "missed")
    assert any("DEADLINE_EXCEEDED" in note for note in failed.notes)


@pytest.mark.parametrize(
    ("downloads", "errors", "met"), [(1.0, 0, True), (2.0, 0, False), (1.0, 1, False)]
)
def test_singleflight_wants_one_download_and_every_request_served(
    downloads: float, errors: int, met: bool
) -> None:
    section = Section(11, "tiers")
    records = [_request("x", 0.4, "boom" if i < errors else "") for i in range(16)]

    singleflight_figures(section, downloads, records)

    assert section.goals[-1].met is met
    assert section.goals[-1].value == f"{downloads:.0f}"


def test_disk_is_compared_with_the_bound() -> None:
    section = Section(11, "tiers")
    bound = 45_107_920
    disk_figures(section, disk=DiskUse(bound, 0), gauge=float(bound), peak=0, bound=bound)
    assert _goal(section) == ("45,107,920", True)
    # The index and manifests count: a byte over the bound misses it.
    disk_figures(section, disk=DiskUse(bound + 1, 30_815), gauge=float("nan"), peak=0, bound=bound)
    assert _goal(section) == ("45,107,921", False)
    assert section.tables[-1].rows[0][2:4] == ["30,815", "n/a"]


def _window(tokens_per_s: float, failures: int = 0) -> Window:
    records = [Record("x", 0.0, 0.1, 1.0, 10, 0, "UNAVAILABLE") for _ in range(failures)]
    itl = {"p50": 0.02, "p90": 0.03, "p99": 0.05, "max": 0.05, "n": 10}
    return Window(1.0, int(tokens_per_s), records, itl, {"front": 0.1, "client": 0.1})


def test_throughput_ratio_pairs_the_repeats_and_counts_failures() -> None:
    section = Section(11, "tiers")
    runs = Runs(
        {
            "many": [_window(t) for t in (850, 700, 900, 860, 840)],
            "few": [_window(1000) for _ in range(5)],
            "few (again)": [_window(1000) for _ in range(5)],
        },
        "few",
    )
    downloads = {"many": [40.0, 52.0, 47.0, 45.0, 50.0], "few": [0.0] * 5}

    throughput_figures(section, runs, downloads, "many", "few")
    ratio = next(g for g in section.goals if g.figure.startswith("tokens/s"))
    assert (ratio.value.split(" [")[0], ratio.verdict) == ("0.850", "inconclusive")
    assert [r["downloads"] for r in section.repeats["many"]] == [40.0, 52.0, 47.0, 45.0, 50.0]
    assert section.goals[-1].verdict == "met"  # no failed request

    runs.windows["many"][0] = _window(850, failures=1)
    failing = Section(11, "tiers")
    throughput_figures(failing, runs, downloads, "many", "few")
    assert failing.goals[-1].verdict == "missed"


def test_tier_table_shows_what_the_replica_does_not_export_as_missing() -> None:
    section = Section(11, "tiers")

    tier_table(section, parse_metrics(EXPOSITION))

    rows = {row[0]: row[1] for row in section.tables[-1].rows}
    assert rows["downloads"] == 7
    assert rows["misses (disk)"] == 3
    assert rows["mean load wait from store (ms)"] == pytest.approx(200)
    assert rows["adapters in tier slot"] != rows["adapters in tier slot"]  # NaN: n/a


async def test_seed_pushes_every_name_from_a_few_variants(
    store_server: RunningStore, tiny_adapter: TinyAdapterFactory
) -> None:
    sources = [await storeops.hashed(tiny_adapter(seed=s)) for s in (0, 1)]
    names = [adapter_name(i) for i in range(12)]

    async with grpc.aio.insecure_channel(store_server.address) as channel:
        revisions = await seed(channel, names, sources, concurrency=4)
        listing = await storeops.store_stub(channel).ListAdapters(
            store_pb.ListAdaptersRequest(page_size=100)
        )

    assert revisions == dict.fromkeys(names, 1)
    assert [a.name for a in listing.adapters] == names
    digests = {a.name: {f.sha256 for f in a.current.files} for a in listing.adapters}
    assert digests["ad0000"] == digests["ad0002"] != digests["ad0001"]
