"""Benchmark 11's tables and goals, computed from what was measured (kept apart from
the measuring so that the verdicts are unit-tested)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["rotated"]  # the order of the arms, re-exported with the figures

from bench.load.workload import Record
from bench.method.paired import Runs, arm_table, failure_check, noise_figures, ratio_goal, rotated
from bench.method.report import Cell, Section
from bench.method.stats import (
    median,
    median_interval,
    paired_difference,
    paired_ratio,
    percentile,
    ratio,
)
from bench.tiers.rig import DiskUse, Sample, metric_or_nan

MIB = 2**20
STARTUP_GOAL = 1.2
RSS_GOAL = 1.1
COLD_MARGIN_S = 0.150
THROUGHPUT_GOAL = 0.8


@dataclass(frozen=True)
class Start:
    """One replica start: seconds from the process's start to SERVING, RSS then."""

    seconds: float
    rss_mib: float


@dataclass(frozen=True)
class FirstRequest:
    """One request, alone on the replica, with the downloads it caused."""

    record: Record
    downloads: float


def start_order(few: str, many: str, repeats: int) -> list[str]:
    """Arms of every start, rotated each repeat, the last start being `many`'s (its
    replica is kept for the other figures, nothing starts beside it)."""
    arms = [few, many] if rotated([few, many], repeats - 1)[-1] == many else [many, few]
    return [arm for rep in range(repeats) for arm in rotated(arms, rep)]


def startup_figures(
    section: Section, few: tuple[str, list[Start]], many: tuple[str, list[Start]]
) -> None:
    """Start-up time and RSS once SERVING, many adapters ÷ few (medians over starts)."""
    rows: list[list[Cell]] = []
    for arm, starts in (few, many):
        seconds = [s.seconds for s in starts]
        section.record(arm, [{"seconds": s.seconds, "rss_mib": s.rss_mib} for s in starts])
        rows.append(
            [
                arm,
                len(starts),
                median(seconds),
                min(seconds, default=math.nan),
                max(seconds, default=math.nan),
                median([s.rss_mib for s in starts]),
            ]
        )
    section.table(
        "Fresh replica (empty adapter cache): process start -> health SERVING, and RSS of "
        "its process tree then (medians over the starts)",
        ["store", "starts", "to SERVING s", "min s", "max s", "RSS MiB"],
        rows,
    )
    section.goal(
        f"replica start -> SERVING, {many[0]} ÷ {few[0]} (starts paired)",
        paired_ratio([s.seconds for s in many[1]], [s.seconds for s in few[1]]),
        "<=",
        STARTUP_GOAL,
        ".2f",
        metric="startup_s",
    )


def rss_goal(section: Section, few: tuple[str, list[Start]], many: tuple[str, list[Start]]) -> None:
    """RSS once SERVING, many adapters ÷ few (starts paired)."""
    section.goal(
        f"inference RSS once SERVING, {many[0]} ÷ {few[0]}",
        paired_ratio([s.rss_mib for s in many[1]], [s.rss_mib for s in few[1]]),
        "<=",
        RSS_GOAL,
        ".2f",
        metric="rss_mib",
    )


def rss_after_figures(
    section: Section, serving_mib: float, after_mib: Sequence[float], host: float
) -> None:
    """RSS of the kept replica after each Zipf run (its host tier filled) ÷ its RSS once
    SERVING: whether memory stays flat once adapters are loaded, not only at start."""
    section.record_values("RSS after each traffic repeat (MiB)", "rss_mib", list(after_mib))
    section.goal(
        f"inference RSS after the Zipf traffic (host tier: {host:.0f} adapters) ÷ once SERVING",
        median_interval([ratio(a, serving_mib) for a in after_mib]),
        "<=",
        RSS_GOAL,
        ".2f",
    )


def _ms(samples: Sequence[float], q: float) -> float:
    return percentile(samples, q) * 1000


def _cold_table(
    section: Section,
    cold: Sequence[FirstRequest],
    warm: Sequence[FirstRequest],
    cold_s: list[float],
    warm_s: list[float],
) -> None:
    section.table(
        "TTFT (ms) of one request at a time: the first to an adapter never loaded on the "
        "replica (download, verify, load included), then the same adapters again",
        ["request", "adapters", "p50", "p99", "max", "failed"],
        [
            [
                label,
                len(samples),
                _ms(samples, 50),
                _ms(samples, 99),
                _ms(samples, 100),
                sum(1 for r in requests if r.record.error),
            ]
            for label, samples, requests in (
                ("first (never loaded)", cold_s, cold),
                ("warm (same adapters)", warm_s, warm),
            )
        ],
    )


def cold_ttft_figures(
    section: Section, cold: Sequence[FirstRequest], warm: Sequence[FirstRequest]
) -> None:
    """TTFT of first requests to never-loaded adapters vs the same adapters warm. Only
    adapters whose first request downloaded them count (the others were prefetched)."""
    loaded = {c.record.adapter for c in cold if c.downloads >= 1 and not c.record.error}
    failed = [r.record for r in (*cold, *warm) if r.record.error]
    cold_s = [c.record.ttft for c in cold if c.record.adapter in loaded]
    warm_s = [w.record.ttft for w in warm if w.record.adapter in loaded and not w.record.error]
    section.record(
        "first request, never loaded",
        [
            {
                "ttft_ms": c.record.ttft * 1000,
                "downloads": c.downloads,
                "failed": bool(c.record.error),
            }
            for c in cold
        ],
    )
    section.record_values("same adapter, warm", "ttft_ms", [w.record.ttft * 1000 for w in warm])
    _cold_table(section, cold, warm, cold_s, warm_s)
    prefetched = len(cold) - len(loaded) - sum(1 for c in cold if c.record.error)
    if prefetched:
        section.notes.append(
            f"{prefetched} of the {len(cold)} adapters tried were already on the replica "
            "(no download on their first request): left out of the TTFT figures"
        )
    if failed:
        section.notes.append(f"first failed single request: {failed[0].error}")
    pairs = [
        (c.record.ttft * 1000, w.record.ttft * 1000)
        for c, w in zip(cold, warm, strict=True)
        if c.record.adapter in loaded and not w.record.error
    ]
    section.goal(
        "first request to a never-loaded adapter: TTFT - the same adapter's warm TTFT (ms)",
        paired_difference([c for c, _ in pairs], [w for _, w in pairs]),
        "<=",
        COLD_MARGIN_S * 1000,
        ".0f",
    )
    section.check("failed single requests (cold and warm)", len(failed), "0", not failed)
    section.reported(
        "TTFT p99 (ms), first request to a never-loaded adapter",
        _ms(cold_s, 99),
        ".0f",
        note=f"reported (warm p99 {_ms(warm_s, 99):.0f})",
    )


def singleflight_figures(section: Section, downloads: float, records: Sequence[Record]) -> None:
    """Concurrent first requests for one never-loaded adapter -> downloads (1)."""
    ok = [r for r in records if not r.error]
    section.record(
        "concurrent first requests",
        [{"downloads": downloads, "requests": len(records), "succeeded": len(ok)}],
    )
    ttfts = [r.ttft for r in ok]
    section.table(
        f"{len(records)} concurrent first requests for one never-loaded adapter",
        ["requests", "succeeded", "downloads", "TTFT p50 ms", "TTFT max ms"],
        [[len(records), len(ok), downloads, _ms(ttfts, 50), _ms(ttfts, 100)]],
    )
    if len(ok) < len(records):
        section.notes.append(
            f"concurrent first request failed: {next(r.error for r in records if r.error)}"
        )
    section.check(
        f"downloads for {len(records)} concurrent first requests to one adapter "
        f"({len(ok)} of {len(records)} succeeded)",
        downloads,
        "= 1, all succeed",
        downloads == 1 and len(ok) == len(records),
        ".0f",
    )


def disk_figures(section: Section, *, disk: DiskUse, gauge: float, peak: int, bound: int) -> None:
    """Bytes under the adapter cache after the Zipf traffic vs --adapter-cache-size."""
    section.record(
        "adapter cache on disk",
        [
            {
                "disk_bytes": disk.total,
                "dotfile_bytes": disk.dotfiles,
                "gauge_bytes": gauge,
                "peak_sampled_bytes": peak,
                "bound_bytes": bound,
            }
        ],
    )
    section.table(
        "Adapter cache after the Zipf traffic (bytes)",
        [
            "--adapter-cache-size",
            "files on disk",
            "of which dot-files (index, manifests)",
            "cache_bytes gauge",
            "peak sampled (every 0.5 s)",
        ],
        [[f"{bound:,}", f"{disk.total:,}", f"{disk.dotfiles:,}", _bytes(gauge), f"{peak:,}"]],
    )
    section.check(
        "disk used (bytes) after Zipf traffic, cache bound = 10 % of the adapters",
        disk.total,
        f"<= {bound:,} (the bound, {bound / MIB:.1f} MiB)",
        disk.total <= bound,
        ",",
    )


def _bytes(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.0f}"


def throughput_figures(
    section: Section, runs: Runs, downloads: dict[str, list[float]], many: str, few: str
) -> None:
    """tokens/s over many adapters ÷ over few, same replica and workload (per-repeat
    ratios); `downloads`: the replica's downloads during each run (they explain the gap)."""
    for arm, windows in runs.windows.items():
        section.record(
            arm,
            [
                {**w.summary(), "downloads": loaded}
                for w, loaded in zip(windows, downloads.get(arm, []), strict=False)
            ],
        )
    arm_table(section, runs)
    section.table(
        "Downloads from the store during each arm's windows (median over repeats)",
        ["arm", "downloads"],
        [[arm, median(loaded)] for arm, loaded in downloads.items()],
    )
    ratio_goal(
        section,
        runs,
        f"tokens/s, {many} ÷ {few}",
        (many, few),
        "tokens_per_s",
        ">=",
        THROUGHPUT_GOAL,
    )
    noise_figures(section, runs, ("tokens_per_s",))
    failure_check(section, runs)


def tier_table(section: Section, samples: Sequence[Sample]) -> None:
    """The replica's own account of its tiers after the traffic (n/a: not exported)."""
    prefix = "loraserve_inference_adapter_"
    rows: list[list[Cell]] = [["downloads", metric_or_nan(samples, prefix + "downloads_total")]]
    for kind in ("misses", "evictions"):
        for tier in ("engine", "disk"):
            rows.append(
                [f"{kind} ({tier})", metric_or_nan(samples, f"{prefix}{kind}_total", tier=tier)]
            )
    for source in ("disk", "store"):
        count = metric_or_nan(samples, prefix + "load_seconds_count", source=source)
        total = metric_or_nan(samples, prefix + "load_seconds_sum", source=source)
        rows.append([f"loads from {source}", count])
        rows.append([f"mean load wait from {source} (ms)", ratio(total, count) * 1000])
    for tier in ("slot", "host", "engine", "disk", "routed"):
        rows.append(
            [
                f"adapters in tier {tier}",
                metric_or_nan(samples, prefix + "tier_adapters", tier=tier),
            ]
        )
    rows.append(
        ["cache capacity (MiB)", metric_or_nan(samples, prefix + "cache_capacity_bytes") / MIB]
    )
    section.table("The replica's tier metrics after the traffic", ["metric", "value"], rows)
