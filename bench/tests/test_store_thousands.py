"""The adapter store at thousands of adapters: its goals come from every repeat, and a
quick run names the smaller store it measured."""

from __future__ import annotations

from pathlib import Path

from bench.method.report import Report


def test_store_scale_goals_come_from_every_repeat(tmp_path: Path) -> None:
    from bench.store.thousands import Measured, report_goals

    measured = Measured(
        pushes_per_s={
            "small": [50.0, 40.0, 60.0, 50.0, 40.0],
            "large": [45.0, 38.0, 57.0, 47.0, 20.0],
            "small again": [50.0, 40.0, 60.0, 50.0, 40.0],
        },
        list_s=[0.4, 1.5, 0.5, 0.45, 0.42],
        restart_s={"small": [0.7], "large": [6.0, 1.0, 1.2, 1.1, 1.3]},
    )
    section = Report(tmp_path, {}).section(12, "The adapter store at 10,000 adapters")
    report_goals(section, measured, 10_000)
    assert [(g.figure, g.value.split(" [")[0], g.verdict) for g in section.goals] == [
        ("store ListAdapters, 10,000 adapters (s)", "0.450", "inconclusive"),
        ("store restart with 10,000 adapters → SERVING (s)", "1.20", "inconclusive"),
        ("push with 10,000 ÷ push with 10 (pushes/s, rounds paired)", "0.94", "inconclusive"),
    ]
    assert section.noises[0].estimate.value == 1.0


def test_a_quick_store_scale_run_names_its_smaller_store(tmp_path: Path) -> None:
    from bench.store.thousands import QUICK, Measured, report_goals

    measured = Measured(
        {"small": [10.0], "large": [8.0], "small again": []},
        [0.1],
        {"small": [1.0], "large": [1.0]},
    )
    section = Report(tmp_path, {}).section(12, "quick")
    report_goals(section, measured, QUICK.adapters)
    assert section.goals[0].figure == "store ListAdapters, 1,000 adapters (s)"
    # One round: a figure to show, no verdict.
    assert (section.goals[2].value, section.goals[2].verdict) == ("0.80 n=1", "reported")
