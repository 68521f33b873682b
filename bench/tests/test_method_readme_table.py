"""The README's performance table is the committed benchmark runs' (each benchmark from
the newest run that has it); the
benchmark's competitor arms run vLLM with loraserve's exact engine settings and count
streamed tokens the way the servers send them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.method import measured_code, readme_prose, readme_table
from bench.method.cpu import cpu_seconds
from bench.method.report import Report
from bench.method.stats import Estimate


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


def _run(
    results: Path,
    *,
    quick: bool,
    met: bool,
    numbers: tuple[int, ...] = (8,),
    value: float = 0,
    commit: str = "",
) -> Path:
    """A run's results.json, made at `commit` (default: this checkout's HEAD) with
    nothing uncommitted, whatever the working tree holds now."""
    report = Report(results, {"command": "python -m bench", "quick": quick})
    commit = commit or measured_code.head(readme_table.README.parent)[0]
    report.machine.update({"git commit": commit, "uncommitted code": ""})
    for number in numbers:
        section = report.section(number, f"Benchmark {number}")
        measured = value or (1.62 if met else 1.2)
        estimate = Estimate(measured, measured - 0.01, measured + 0.01, 5)
        section.goal(f"figure of {number}", estimate, ">=", 1.5, ".2f")
    report.write()
    return results / "results.json"


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


def test_results_keep_every_repeat_of_every_arm(tmp_path: Path) -> None:
    from bench.load.workload import Record, RunResult

    report = Report(tmp_path, {})
    runs = [RunResult([Record("t00", 0.0, 0.1, 1.0, 10)]) for _ in range(3)]
    report.section(1, "gRPC overhead").record_repeats({"grpc": runs})
    report.write()
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["tokens_per_s"] for r in data["sections"][0]["repeats"]["grpc"]] == [10.0] * 3
    assert {"git commit", "vllm", "torch", "grpcio", "cpu", "cores"} <= set(data["machine"])


@pytest.mark.parametrize("engine", ["cpu", "gpu"])
def test_baselines_get_engine_a_settings(engine: str) -> None:
    """The dry run derives every server's flags as a run would, and fails if vLLM would
    parse the baselines' flags into engine arguments other than engine A's."""
    from bench.plan import plans

    commands = plans(engine)[8].servers
    serve = commands["vllm serve"]
    assert serve[serve.index("--max-loras") + 1] == "8"
    assert "--enable-lora" in commands["vLLM gRPC"]
    gpu_share = "--gpu-memory-utilization=0.15"
    assert (gpu_share in commands["inference serve (engine A, bench.rig.engine_host)"]) == (
        engine == "gpu"
    )
    engine_c = plans(engine)[3].servers["inference serve (engine C)"]
    assert "--max-loras=32" in engine_c


def test_the_gpu_dry_run_covers_every_benchmark_and_fits_the_device_and_window() -> None:
    """Every benchmark of either profile has command lines in the gpu dry run; every
    engine they start gets its share of the device, the shares up at once sum to at
    most 0.9, and the GPU run's budgets fit 15 minutes."""
    from bench.__main__ import PROFILE_BENCHMARKS
    from bench.method import gpu
    from bench.plan import check_gpu, plans

    every = {n for numbers in PROFILE_BENCHMARKS.values() for n in numbers}
    planned = plans("gpu")
    assert set(planned) == every
    assert check_gpu(planned) == []
    for plan in planned.values():
        engines = [
            argv
            for argv in plan.servers.values()
            if any(x == "--model" or x.startswith("--model=") for x in argv)
        ]
        assert all(any("gpu-memory-utilization" in x for x in argv) for argv in engines), (
            f"benchmark {plan.number} starts an engine with no share of the device"
        )
    assert set(gpu.BUDGETS_S) | set(gpu.LEFT_OUT) == every
    assert gpu.expected_total_s() <= gpu.WINDOW_S


def test_update_fills_an_empty_block() -> None:
    text = f"{readme_table.BEGIN}\n{readme_table.END}\n"
    assert readme_table.readme_block(text) == ""
    assert readme_table.update(text, "t") == f"{readme_table.BEGIN}\nt\n{readme_table.END}\n"


async def _stream_from_stub(
    events: list[dict[str, object]],
) -> tuple[list[object], dict[str, object]]:
    """Runs the HTTP arms' caller against a stub server that streams `events` as SSE;
    returns what the caller yielded (or the exception it raised) and the request body."""
    from aiohttp import web

    from bench.load.calls import http_session, openai_caller

    seen: list[dict[str, object]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    got: list[object] = []
    try:
        async with http_session() as http:
            call = openai_caller(http, f"http://127.0.0.1:{port}", "base")
            try:
                async for delta in call("", [3, 4], 3):
                    got.append(delta)
            except RuntimeError as exc:
                got.append(exc)
    finally:
        await runner.cleanup()
    return got, seen[0]


async def test_openai_caller_counts_streamed_token_ids() -> None:
    """The HTTP arms count tokens from `return_token_ids` in each SSE chunk, the way vLLM
    and loraserve's front send them (a stub server replays that shape)."""
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "text": "x", "token_ids": ids}]} for ids in ([5], [], [6, 7])
    ]
    deltas, body = await _stream_from_stub(events)
    assert deltas == [(1, 0), (2, 0)]
    sent = {key: body[key] for key in ("model", "prompt", "stream", "return_token_ids")}
    assert sent == {"model": "base", "prompt": [3, 4], "stream": True, "return_token_ids": True}


async def test_openai_caller_fails_the_request_on_an_error_inside_the_stream() -> None:
    """A server that fails mid-stream answers 200 and sends an error event: the request
    is a failure, not a short success."""
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "text": "x", "token_ids": [5]}]},
        {"error": {"message": "engine died", "code": 500}},
    ]
    got, _ = await _stream_from_stub(events)
    assert got[0] == (1, 0)
    assert isinstance(got[1], RuntimeError)
    assert "engine died" in str(got[1])


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


def test_the_tuning_advice_quotes_the_figures_of_the_newest_run(tmp_path: Path) -> None:
    old = _run(tmp_path / "2026-12-01T0300Z", quick=False, met=True, numbers=(8,), value=1.61)
    new = _run(tmp_path / "2026-12-01T0400Z", quick=False, met=True, numbers=(8,), value=1.7)
    advice = readme_prose.render([old, new], "runs {{8: figure of\n  8}}x, at most")
    assert advice == "runs 1.70x, at most"


def test_tuning_advice_that_quotes_a_figure_no_run_has_fails_naming_it(tmp_path: Path) -> None:
    results = _run(tmp_path / "run", quick=False, met=True, numbers=(8,))
    with pytest.raises(KeyError, match="benchmark 8's 'figure of 9'"):
        readme_prose.render([results], "{{8: figure of 9}}")


async def test_a_benchmark_over_its_gpu_budget_fails_itself_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from bench.method import gpu

    monkeypatch.setitem(gpu.BUDGETS_S, 99, 0.01)
    report = Report(tmp_path, {})
    budget = gpu.Budget(enabled=True)
    async with budget.limit(report, 99):
        report.section(99, "a slow benchmark")
        await asyncio.Event().wait()  # never set: only the budget ends it
    assert "over its GPU budget of 0.01 s" in report.sections[-1].error

    async with gpu.Budget(enabled=False).limit(report, 99):
        await asyncio.sleep(0.02)  # no budget off the GPU


def test_a_profiled_event_loop_waiting_in_epoll_counts_as_idle(tmp_path: Path) -> None:
    from bench.front import spy_summary

    loop = "main (x.py:1);Runner.run (asyncio/runners.py:118);run_forever (loop.c:1)"
    profile = tmp_path / "profile.txt"
    profile.write_text(
        f"{loop};epoll_pwait (libc.so.6) 7\n"
        f"{loop};process_outputs (vllm/v1/engine/output_processor.py:700) 3\n"
    )
    summary = spy_summary.summarize(profile)
    assert summary.splitlines()[0] == "10 samples, 3 of them the event loop busy"
    assert "epoll_pwait" not in summary


async def test_the_stream_probe_lets_requests_in_flight_finish_after_its_window() -> None:
    import asyncio
    import os
    from collections.abc import AsyncIterator, Sequence

    from bench.front import stream_probe

    started = finished = 0

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        nonlocal started, finished
        started += 1
        for _ in range(max_tokens):
            await asyncio.sleep(0.01)
            yield 1, 1
        finished += 1

    seen = await stream_probe.measure("fake", call, os.getpid(), 4, 20, 0.1, 0.3)
    assert seen.tokens > 0
    assert started == finished


_BURN_5_MS = """
import sys, time
while time.process_time() < 0.005:
    pass
print(time.process_time(), flush=True)
sys.stdin.read()
"""


def test_another_process_cpu_time_is_read_below_a_clock_tick() -> None:
    # /proc/PID/stat counts whole 10 ms ticks; a process that ran less reads short.
    child = subprocess.Popen(
        [sys.executable, "-S", "-c", _BURN_5_MS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ran = float(child.stdout.readline())
        assert cpu_seconds(child.pid) >= ran
    finally:
        child.communicate("")
