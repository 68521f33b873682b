"""A run's results.json keeps every repeat of every arm, not only the summary, and the
machine it ran on."""

from __future__ import annotations

import json
from pathlib import Path

from bench.method.report import Report


def test_results_keep_every_repeat_of_every_arm(tmp_path: Path) -> None:
    from bench.load.workload import Record, RunResult

    report = Report(tmp_path, {})
    runs = [RunResult([Record("t00", 0.0, 0.1, 1.0, 10)]) for _ in range(3)]
    report.section(1, "gRPC overhead").record_repeats({"grpc": runs})
    report.write()
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["tokens_per_s"] for r in data["sections"][0]["repeats"]["grpc"]] == [10.0] * 3
    assert {"git commit", "vllm", "torch", "grpcio", "cpu", "cores"} <= set(data["machine"])


def test_results_keep_every_repeat_of_single_figure_arms(tmp_path: Path) -> None:
    report = Report(tmp_path, {})
    section = report.section(5, "Cold start")
    section.record_values("cold", "ttft_s", [0.1, 0.2])
    section.record("events", [{"commit_s": 0.01, "deliveries": 50}])
    report.write()
    repeats = json.loads((tmp_path / "results.json").read_text())["sections"][0]["repeats"]
    assert repeats == {
        "cold": [{"ttft_s": 0.1}, {"ttft_s": 0.2}],
        "events": [{"commit_s": 0.01, "deliveries": 50}],
    }
