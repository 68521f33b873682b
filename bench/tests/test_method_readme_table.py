"""The README's performance table is the committed benchmark runs' (each benchmark from
the newest run that has it), with figures, goals and verdicts from the data; the tuning
advice beside it quotes the same runs."""

from __future__ import annotations

from pathlib import Path

from bench.method import readme_prose, readme_table
from bench.tests.helpers import write_run as _run


def test_readme_table_and_advice_are_the_committed_results() -> None:
    """Figures, goals, verdicts and measuring commits; never the ages, which depend on
    HEAD (a change that claims no performance effect lands without a benchmark run)."""
    runs = readme_table.runs()
    text = readme_table.README.read_text()
    block = readme_table.readme_block(text)
    assert block is not None, f"README has no {readme_table.BEGIN} block"
    newest = {n: p.parent.name for n, p in sorted(readme_table.sources(runs).items())}
    assert readme_table.comparable(block) == readme_table.comparable(readme_table.render(runs)), (
        f"README's performance table is not the newest runs' ({newest}): run `make bench-readme`"
    )
    assert readme_table.readme_block(text, "tuning") == readme_prose.render(runs), (
        "README's tuning advice does not quote the committed runs: run `make bench-readme`"
    )


def test_table_takes_figures_and_verdicts_from_the_data(tmp_path: Path) -> None:
    table = readme_table.render(_run(tmp_path / "run", quick=False, met=False))
    assert "| 8 | figure of 8 | 1.20 [1.19, 1.21] n=5 | >= 1.50 | **missed** |" in table
    assert "Smoke run" not in table


def test_a_smoke_run_is_labelled_as_one(tmp_path: Path) -> None:
    table = readme_table.render(_run(tmp_path / "run", quick=True, met=True))
    assert "**Smoke run" in table
    assert "| 1.62 [1.61, 1.63] n=5 | >= 1.50 | met |" in table


def test_runs_are_ordered_by_their_directory_date(tmp_path: Path) -> None:
    _run(tmp_path / "2026-12-02T0100Z", quick=True, met=True)
    _run(tmp_path / "2026-12-01T0300Z", quick=False, met=True)
    names = [p.parent.name for p in readme_table.runs(tmp_path)]
    assert names == ["2026-12-01T0300Z", "2026-12-02T0100Z"]


def test_each_benchmark_comes_from_the_newest_run_that_has_it(tmp_path: Path) -> None:
    _run(tmp_path / "2026-12-01T0300Z", quick=False, met=True, numbers=(1, 8, 10), value=1.61)
    _run(tmp_path / "2026-12-01T0400Z", quick=False, met=False, numbers=(8,), value=1.22)
    _run(tmp_path / "2026-12-01T0500Z", quick=True, met=True, numbers=(11,), value=1.93)

    table = readme_table.render(readme_table.runs(tmp_path))

    rows = [
        line.rpartition(" measured at ")[0]
        for line in table.splitlines()
        if line.startswith("| ") and "figure of" in line
    ]
    assert rows == [
        "| 1 | figure of 1 | 1.61 [1.60, 1.62] n=5 | >= 1.50 | met |",
        "| 8 | figure of 8 | 1.22 [1.21, 1.23] n=5 | >= 1.50 | **missed** |",
        "| 10 | figure of 10 | 1.61 [1.60, 1.62] n=5 | >= 1.50 | met |",
        "| 11 | figure of 11 | 1.93 [1.92, 1.94] n=5 | >= 1.50 | met |",
    ]
    runs = [line for line in table.splitlines() if line.startswith("Benchmark")]
    assert [line.split(":")[0] for line in runs] == [
        "Benchmark 11",
        "Benchmark 8",
        "Benchmarks 1, 10",
    ]
    # The smoke label follows the run it belongs to, only that one.
    lines = table.splitlines()
    assert lines[lines.index(runs[0]) + 2].startswith("**Smoke run")
    assert table.count("**Smoke run") == 1


def test_a_new_run_joins_the_committed_ones_as_the_newest(tmp_path: Path) -> None:
    committed = tmp_path / "results"
    old = _run(committed / "2026-12-01T0300Z", quick=False, met=True, numbers=(1, 11))
    new = _run(tmp_path / "elsewhere", quick=False, met=False, numbers=(11,))

    assert readme_table.with_run(new, committed) == [old, new]
    assert readme_table.with_run(old, committed) == [old]


def test_update_replaces_only_the_marked_block() -> None:
    text = f"intro\n{readme_table.BEGIN}\nold\n{readme_table.END}\nafter\n"
    updated = readme_table.update(text, "new \\1 table")
    assert updated == f"intro\n{readme_table.BEGIN}\nnew \\1 table\n{readme_table.END}\nafter\n"


def test_update_fills_an_empty_block() -> None:
    text = f"{readme_table.BEGIN}\n{readme_table.END}\n"
    assert readme_table.readme_block(text) == ""
    assert readme_table.update(text, "t") == f"{readme_table.BEGIN}\nt\n{readme_table.END}\n"
