"""`python -m bench.method.readme_table [--write README.md]`: the README's performance table,
generated from the runs under bench/results/ (their results.json: the figures, their
goals and verdicts as the benchmarks computed them, the machine and the command), each
benchmark's figures from the newest run that has that benchmark (a run of `--only 11`
replaces benchmark 11's figures, the others stay), and the tuning advice whose figures
come from them (readme_prose). Prints the table; --write puts both between the README's
markers.

Every row says the commit that measured it and, where the code its benchmark declares
(measured_code) changed since, how many commits and days behind HEAD it is; a row more
than 30 days behind is shown stale. Ages are as of the HEAD the block was made at, which
it names: bench/tests/test_method_readme_table.py checks that the README's figures, goals,
verdicts and commits are the committed results' (`comparable`), never how old they are, so
a change that claims no performance effect lands without rerunning any benchmark."""

from __future__ import annotations

import argparse
import datetime
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.method import measured_code, readme_prose

RESULTS = Path(__file__).resolve().parents[1] / "results"
README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = "<!-- bench:table -->"
END = "<!-- /bench:table -->"
# What in a block depends on HEAD rather than on the results: the line naming the HEAD
# that ages are measured to, each row's age after its commit, and the stale mark.
_AGES_LINE = re.compile(r"^Ages are as of commit .*$\n?", re.M)
_ROW_AGE = re.compile(r"(\| measured at [0-9a-f]{12} \([0-9-]+\));[^|]*\|")
_STALE_VERDICT = re.compile(r"\*\*stale\*\* \(([^)]*)\)")
_BOLD = re.compile(r"\*\*(missed|too noisy)\*\*")
_SHOWN = {"missed": "**missed**", "too noisy": "**too noisy**"}
# Verdicts of results written before intervals (a `met` flag instead of a verdict).
_OLD_VERDICT = {True: "met", False: "missed", None: "reported"}
NO_RUNS = (
    "No benchmark run of this tree is committed yet: `make bench` and `make bench "
    'BENCH_ARGS="--profile real"`, commit `bench/results/<run>/`, then `make bench-readme`.'
)


def runs(results: Path = RESULTS) -> list[Path]:
    """Every run's results.json, oldest first (run directories are named by UTC date
    and time)."""
    return sorted(results.glob("*/results.json"), key=lambda p: p.parent.name)


def with_run(path: Path, results: Path = RESULTS) -> list[Path]:
    """The runs under `results` with `path` (a run just made, wherever it was written)
    as the newest."""
    return [*(p for p in runs(results) if p.resolve() != path.resolve()), path]


def sources(paths: Sequence[Path]) -> dict[int, Path]:
    """Benchmark number -> the newest of `paths` (oldest first) with a section of it."""
    chosen: dict[int, Path] = {}
    for path in paths:
        for section in json.loads(path.read_text())["sections"]:
            chosen[section["number"]] = path
    return chosen


def verdict_of(goal: dict[str, Any]) -> str:
    """A goal's verdict in results.json, from this version's or an older one's."""
    if "verdict" in goal:
        return str(goal["verdict"])
    return _OLD_VERDICT[goal["met"]]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _where(path: Path) -> str:
    """The run's directory as the README links it: relative to the checkout."""
    try:
        return f"{path.parent.resolve().relative_to(README.parent)}/"
    except ValueError:  # a run written outside the checkout (--results)
        return f"{path.parent}/"


def _run_lines(data: dict[str, Any], where: str, numbers: list[int] | None) -> list[str]:
    """How one run was made; `numbers`: the benchmarks the table takes from it, when the
    table takes from several runs."""
    run, machine = data.get("run", {}), data["machine"]
    commit, _, dirty = machine["git commit"].partition(" ")
    commit = commit[:12] + (f" {dirty}" if dirty else "")
    which = "Run"
    if numbers:
        which = f"Benchmark{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}: run"
    lines = [
        f"{which} `{run.get('command', 'python -m bench')}` on {machine['date']}: "
        f"{machine['cpu']}, {machine['cores']} cores, {machine['memory']}, {machine['os']}; "
        f"Python {machine['python']}, {machine['vllm']}, {machine['torch']}, "
        f"{machine['grpcio']}; commit {commit}; {data['total_seconds']:.0f} s. Every arm, "
        f"every repeat, the workloads and plots: [{where}]({where}report.md).",
        "",
    ]
    if run.get("quick"):
        lines += [
            "**Smoke run (`--quick`: two repeats, fewer adapters, on a loaded machine): "
            "these figures show the benchmark works, not how fast loraserve is.**",
            "",
        ]
    return lines


def measured_at(data: dict[str, Any], number: int, repo: Path = README.parent) -> tuple[str, bool]:
    """Where benchmark `number`'s figures in a run (its results.json) were measured, with
    their age at HEAD, as a row shows it; and whether they are stale."""
    machine = data["machine"]
    commit = machine["git commit"].partition(" ")[0]
    age = measured_code.age(number, commit, machine.get("uncommitted code", ""), repo)
    where = f"measured at {commit[:12]} ({machine['date'].split()[0]})"
    behind = age.describe()
    return (f"{where}; {behind}" if behind else where), age.stale


def ages_line(repo: Path = README.parent) -> str:
    commit, seconds = measured_code.head(repo)
    day = datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%d")
    return (
        f"Ages are as of commit {commit[:12]} ({day}; `make bench-readme` brings them up to "
        f"date). A row whose benchmark's code (bench/method/measured_code.py) changed more "
        f"than {measured_code.STALE_AFTER_DAYS} days before that is **stale**: run it again."
    )


def render(paths: Path | Sequence[Path], repo: Path = README.parent) -> str:
    """The markdown block (without markers): each benchmark's figures from the newest
    of `paths` (results.json files, oldest first) that has it, aged at `repo`'s HEAD."""
    ordered = [paths] if isinstance(paths, Path) else list(paths)
    if not ordered:
        return NO_RUNS
    chosen = sources(ordered)
    used = [p for p in reversed(ordered) if p in chosen.values()]  # newest first
    several = len(used) > 1
    lines = [
        "<!-- generated by `python -m bench.method.readme_table --write README.md` from "
        f"{', '.join(_where(p) for p in used)}; do not edit -->",
        ages_line(repo),
        "",
    ]
    rows: list[tuple[int, list[str]]] = []
    for path in used:
        data: dict[str, Any] = json.loads(path.read_text())
        mine = sorted(n for n, p in chosen.items() if p == path and n)  # 0: a set-up
        lines += _run_lines(data, _where(path), mine if several else None)
        for section in data["sections"]:
            if chosen[section["number"]] == path:
                where, is_stale = measured_at(data, section["number"], repo)
                rows.append((section["number"], section_rows(section, where, is_stale)))
    lines += [
        "| # | figure | measured (median [95 % interval] n=repeats) | goal | verdict | code |",
        "|---|---|---|---|---|---|",
    ]
    for _, section_lines in sorted(rows, key=lambda pair: pair[0]):
        lines += section_lines
    return "\n".join(lines)


def comparable(block: str) -> str:
    """`block` without what depends on HEAD rather than on the results (which HEAD the
    ages are of, each row's age, the stale mark): two blocks made from the same results
    at different commits compare equal."""
    block = _AGES_LINE.sub("", block)
    block = _ROW_AGE.sub(r"\1 |", block)
    block = _STALE_VERDICT.sub(r"\1", block)
    return _BOLD.sub(r"\1", block)


def _verdict_cell(verdict: str, is_stale: bool) -> str:
    shown = _SHOWN.get(verdict, verdict)
    return f"**stale** ({verdict})" if is_stale else shown


def section_rows(section: dict[str, Any], where: str, is_stale: bool) -> list[str]:
    """One benchmark's rows: a failure, its goals, its noise figures; `where`: the
    commit that measured them and their age."""
    number = section["number"]
    rows = []
    if section["error"]:
        rows.append(
            f"| {number} | {_cell(section['title'])} | failed: "
            f"{_cell(section['error'][:200])} | | {_verdict_cell('missed', is_stale)} | "
            f"{_cell(where)} |"
        )
    for goal in section["goals"]:
        rows.append(
            f"| {number} | {_cell(goal['figure'])} | {_cell(goal['value'])} | "
            f"{_cell(goal['target'])} | {_verdict_cell(verdict_of(goal), is_stale)} | "
            f"{_cell(where)} |"
        )
    for noise in section.get("noises", []):
        limit = noise["limit"]
        target = f"within ±{limit:.0%}" if limit is not None else "recorded"
        e = noise["estimate"]
        value = f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}] n={e['n']}"
        rows.append(
            f"| {number} | noise: {_cell(noise['figure'])} | {value} | {target} | "
            f"{_verdict_cell(noise['verdict'], is_stale)} | {_cell(where)} |"
        )
    return rows


def _markers(name: str) -> tuple[str, str, str]:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    # The markers and what lies between them (nothing, in a README never generated).
    return begin, end, rf"{re.escape(begin)}\n(?:(.*?)\n)?{re.escape(end)}"


def readme_block(text: str, name: str = "table") -> str | None:
    """What the README holds between the `name` markers now (None: no markers)."""
    match = re.search(_markers(name)[2], text, re.S)
    return (match.group(1) or "") if match else None


def update(text: str, content: str, name: str = "table") -> str:
    begin, end, pattern = _markers(name)
    if readme_block(text, name) is None:
        raise ValueError(f"README has no {begin} ... {end} block")
    block = f"{begin}\n{content}\n{end}"
    return re.sub(pattern, lambda _: block, text, flags=re.S)


def update_readme(text: str, paths: Sequence[Path]) -> str:
    """The README `text` with its table and its tuning advice made from `paths`."""
    text = update(text, render(paths))
    return update(text, readme_prose.render(paths), "tuning")


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.method.readme_table", description=__doc__
    )
    parser.add_argument("--write", type=Path, metavar="README", help="update this README")
    parser.add_argument(
        "--results",
        type=Path,
        help="one run's results.json, alone (default: every run under bench/results/, "
        "each benchmark from the newest that has it)",
    )
    args = parser.parse_args()
    paths = [args.results] if args.results else runs()
    if args.write:
        args.write.write_text(update_readme(args.write.read_text(), paths))
        print(f"updated {args.write}")
    else:
        print(f"{render(paths)}\n\n{readme_prose.render(paths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
