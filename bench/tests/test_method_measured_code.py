"""Each README row says how far the code its benchmark measures has moved since it was
measured (commits and days, in a scratch git repository here); rows too far behind, or
measured with uncommitted code, are stale. The ages never make a table incomparable."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.method import measured_code, readme_table
from bench.tests.helpers import write_run as _run


def _git(repo: Path, *args: str, day: int = 0) -> str:
    """Runs git in `repo`; commits made on `day` days after 2026-11-01."""
    import os

    date = f"{1_793_491_200 + day * 86_400} +0000"
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    return subprocess.run(
        ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.strip()


def _repo_with_code(tmp_path: Path) -> tuple[Path, str]:
    """A git repository with the store's and the inference service's code and bench/
    committed on day 0; returns it and the commit."""
    repo = tmp_path / "repo"
    for path in (
        "services/adapterstore/loraserve/store.py",
        "services/inference/loraserve/inference/transport/front.py",
        "bench/run.py",
    ):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("one\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "code")
    return repo, _git(repo, "rev-parse", "HEAD")


def _change(repo: Path, path: str, day: int) -> None:
    with (repo / path).open("a") as file:
        file.write("# a comment\n")
    _git(repo, "add", path)
    _git(repo, "commit", "-q", "-m", f"change {path}", day=day)


_STORE_CODE = "services/adapterstore/loraserve/store.py"


_TRANSPORT_CODE = "services/inference/loraserve/inference/transport/front.py"


def _measured_at(repo: Path, commit: str, number: int = 12, uncommitted: str = "") -> str:
    data = {"machine": {"git commit": commit, "date": "2026-11-01 00:00 UTC"}}
    data["machine"]["uncommitted code"] = uncommitted
    return readme_table.measured_at(data, number, repo)[0]


def test_a_row_measured_at_head_names_its_commit_and_no_age(tmp_path: Path) -> None:
    repo, commit = _repo_with_code(tmp_path)
    assert _measured_at(repo, commit) == f"measured at {commit[:12]} (2026-11-01)"


def test_a_row_says_how_many_commits_and_days_its_code_changed_since(tmp_path: Path) -> None:
    repo, commit = _repo_with_code(tmp_path)
    _change(repo, _STORE_CODE, day=2)
    _change(repo, _STORE_CODE, day=3)
    _change(repo, "bench/run.py", day=5)
    assert _measured_at(repo, commit).endswith("; code changed since (2 commits, 3 days)")


def test_a_change_outside_a_benchmarks_declared_code_leaves_its_rows_as_measured(
    tmp_path: Path,
) -> None:
    repo, commit = _repo_with_code(tmp_path)
    _change(repo, _TRANSPORT_CODE, day=1)
    assert "changed" not in _measured_at(repo, commit, number=12)  # the store's
    assert "changed since (1 commit, 0 days)" in _measured_at(repo, commit, number=13)


def test_a_change_to_the_services_tests_leaves_every_row_as_measured(tmp_path: Path) -> None:
    repo, commit = _repo_with_code(tmp_path)
    test = repo / "services/adapterstore/tests/test_store.py"
    test.parent.mkdir(parents=True)
    test.write_text("one\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "a test", day=1)
    assert "changed" not in _measured_at(repo, commit)


def test_rows_more_than_30_days_behind_are_stale_and_the_others_not(tmp_path: Path) -> None:
    repo, commit = _repo_with_code(tmp_path)
    _change(repo, _STORE_CODE, day=1)
    _change(repo, "bench/run.py", day=1 + measured_code.STALE_AFTER_DAYS)
    assert not measured_code.age(12, commit, "", repo).stale
    _change(repo, "bench/run.py", day=2 + measured_code.STALE_AFTER_DAYS)
    assert measured_code.age(12, commit, "", repo).stale


def test_rows_measured_with_uncommitted_code_or_at_an_unknown_commit_are_stale(
    tmp_path: Path,
) -> None:
    repo, commit = _repo_with_code(tmp_path)
    uncommitted = measured_code.age(12, commit, _STORE_CODE, repo)
    assert uncommitted.stale
    assert "uncommitted changes in" in uncommitted.describe()
    assert "unknown commit" in measured_code.age(12, "unknown", "", repo).describe()
    assert "not in this history" in measured_code.age(12, "0" * 40, "", repo).describe()


def test_a_comment_only_change_to_measured_code_leaves_the_table_comparable(
    tmp_path: Path,
) -> None:
    repo, commit = _repo_with_code(tmp_path)
    results = _run(tmp_path / "run", quick=False, met=True, numbers=(12, 13), commit=commit)
    before = readme_table.render(results, repo)
    _change(repo, _STORE_CODE, day=40)
    after = readme_table.render(results, repo)
    assert "code changed since (1 commit, 0 days)" in after
    assert after != before
    assert readme_table.comparable(after) == readme_table.comparable(before)


def test_a_stale_row_is_marked_and_still_comparable(tmp_path: Path) -> None:
    repo, commit = _repo_with_code(tmp_path)
    results = _run(tmp_path / "run", quick=False, met=False, numbers=(12,), commit=commit)
    before = readme_table.render(results, repo)
    _change(repo, _STORE_CODE, day=1)
    _change(repo, "bench/run.py", day=40)
    after = readme_table.render(results, repo)
    assert "| **stale** (missed) |" in after
    assert readme_table.comparable(after) == readme_table.comparable(before)


def test_a_changed_figure_or_commit_is_not_comparable(tmp_path: Path) -> None:
    repo, commit = _repo_with_code(tmp_path)
    table = readme_table.render(_run(tmp_path / "a", quick=False, met=True, commit=commit), repo)
    other = readme_table.render(
        _run(tmp_path / "a", quick=False, met=True, value=1.63, commit=commit), repo
    )
    assert readme_table.comparable(table) != readme_table.comparable(other)
    moved = table.replace(f"measured at {commit[:12]}", "measured at 0123456789ab")
    assert readme_table.comparable(table) != readme_table.comparable(moved)


def test_every_benchmark_declares_code_that_exists() -> None:
    from bench.__main__ import PROFILE_BENCHMARKS

    every = {n for numbers in PROFILE_BENCHMARKS.values() for n in numbers}
    assert set(measured_code.MEASURES) == every
    root = readme_table.README.parent
    for number, paths in measured_code.MEASURES.items():
        missing = [p for p in paths if not (root / p).exists()]
        assert not missing, f"benchmark {number} declares code that does not exist: {missing}"
