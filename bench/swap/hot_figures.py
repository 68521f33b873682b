"""Benchmark 4's storms as figures: the background load's tokens/s in 1-second bins
before, during and after the pushes, the swap latencies, their tables, goals, noise and
plot (kept apart from the measuring in bench.swap.hot)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.load.workload import Record
from bench.method.report import Report, Section
from bench.method.stats import median, median_interval, percentile, unpaired_ratio

BIN_S = 1.0
# The load generator's warm-up (its streams start spread over it); the bins start with
# its window, whose records hold every request running in it.
WARMUP_S = 1.0
BINS_FROM_S = WARMUP_S


def _tokens_per_s(records: list[Record], start: float, end: float) -> float:
    """Tokens generated inside [start, end), each request's spread evenly over the time
    between its first token and its end (closed loops finish in waves otherwise)."""
    tokens = 0.0
    for r in records:
        if r.error or not r.tokens:
            continue
        span = r.finished - r.first_token
        if span <= 0:
            tokens += r.tokens if start <= r.finished < end else 0
            continue
        overlap = min(end, r.finished) - max(start, r.first_token)
        tokens += r.tokens * max(0.0, overlap) / span
    return tokens / (end - start)


@dataclass
class Storm:
    """One storm's measurements."""

    label: str
    adapters: int
    latencies: list[float]
    unseen: int
    missed: int
    to_route: list[float]
    probe_ttft: list[float]
    push_s: list[float]
    requests: int
    failures: int
    records: list[Record]
    timeline: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)

    def bins(self, start: float, end: float) -> list[float]:
        """tokens/s of the background load in each whole second of [start, end)."""
        count = int((end - start) / BIN_S)
        return [
            _tokens_per_s(self.records, start + i * BIN_S, start + (i + 1) * BIN_S)
            for i in range(count)
        ]

    @property
    def before(self) -> list[float]:
        t0, storm_start, _, _ = self.timeline
        return self.bins(t0 + BINS_FROM_S, storm_start)

    @property
    def after(self) -> list[float]:
        _, _, storm_end, until = self.timeline
        return self.bins(storm_end, until)

    @property
    def during(self) -> list[float]:
        _, storm_start, storm_end, _ = self.timeline
        return self.bins(storm_start, storm_end)


def storm_tables(section: Section, storms: tuple[Storm, ...]) -> None:
    section.table(
        "Swap latency: push start -> first token from the new revision (ms)",
        [
            "storm",
            "swaps",
            "unseen (superseded)",
            "never seen",
            "median [interval]",
            "p95",
            "max",
            "push RPC p50",
            "push -> routed p50",
            "probe TTFT p50",
        ],
        [
            [
                s.label,
                len(s.push_s),
                s.unseen,
                s.missed,
                median_interval([x * 1000 for x in s.latencies]).text(".0f"),
                percentile(s.latencies, 95) * 1000,
                max(s.latencies, default=float("nan")) * 1000,
                median(s.push_s) * 1000,
                median(s.to_route) * 1000,
                median(s.probe_ttft) * 1000,
            ]
            for s in storms
        ],
    )
    section.table(
        "Throughput of the background load (tok/s, 1-second bins: median [interval] n=bins)",
        ["storm", "before", "during the pushes", "after", "requests", "failed"],
        [
            [
                s.label,
                median_interval(s.before).text(".0f"),
                median_interval(s.during).text(".0f"),
                median_interval(s.after).text(".0f"),
                s.requests,
                s.failures,
            ]
            for s in storms
        ],
    )


def record_storms(section: Section, storms: tuple[Storm, ...]) -> None:
    """Every swap and every second of every storm in results.json."""
    for s in storms:
        section.record_values(f"{s.label}: push -> first token", "seconds", s.latencies)
        section.record_values(f"{s.label}: push RPC", "seconds", s.push_s)
        section.record_values(f"{s.label}: push -> routed", "seconds", s.to_route)
        for phase in ("before", "during", "after"):
            section.record_values(f"{s.label}: tok/s {phase}", "tokens_per_s", getattr(s, phase))


def storm_goals(section: Section, storms: tuple[Storm, ...]) -> None:
    for s in storms:
        section.goal(
            f"swap latency p50 (s), {s.label}", median_interval(s.latencies), "<", 1.0, ".3f"
        )
        section.check(f"swaps never seen served, {s.label}", s.missed, "0", not s.missed)
        section.reported(f"swap latency p95 (s), {s.label}", percentile(s.latencies, 95), ".3f")
    full = storms[0]
    section.goal(
        "storm / steady tok/s (1-second bins)",
        unpaired_ratio(full.during, full.before + full.after),
        ">=",
        0.9,
        ".2f",
        metric="tokens_per_s",
    )
    section.noise(
        "steady tok/s after / before the storm (1-second bins)",
        unpaired_ratio(full.after, full.before),
        "tokens_per_s",
    )
    failures = sum(s.failures for s in storms)
    section.check("failed requests in the storms", failures, "0", failures == 0)


def plot(report: Report, section: Section, storm: Storm) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latencies = storm.latencies
    t0, storm_start, storm_end, until = storm.timeline
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    ys = storm.bins(t0 + BINS_FROM_S, until)
    xs = [BINS_FROM_S + i * BIN_S for i in range(len(ys))]
    left.plot(xs, ys, drawstyle="steps-post")
    left.axvspan(storm_start - t0, storm_end - t0, alpha=0.15, color="red", label="push storm")
    left.set_xlabel("seconds")
    left.set_ylabel("tokens/s (by completion)")
    left.set_title("Throughput while pushing a revision every second")
    left.legend()
    right.hist([x * 1000 for x in latencies], bins=15)
    right.set_xlabel("push -> first token of new revision (ms)")
    right.set_ylabel("swaps")
    right.set_title("Swap latency")
    report.save_figure(section, "hot_swap.png", figure)
    plt.close(figure)
