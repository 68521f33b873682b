"""`python -m bench.method.readme_table [--write README.md]`: the README's performance table,
generated from the runs under bench/results/ (their results.json: the figures, their
goals and verdicts as the benchmarks computed them, the machine and the command), each
benchmark's figures from the newest run that has that benchmark (a run of `--only 11`
replaces benchmark 11's figures, the others stay). Prints the table; --write puts it
between the README's `<!-- bench:table -->` markers. tests/test_bench.py fails when the
README and the committed results disagree, and while any row is stale: taken from a run
whose commit differs from HEAD in services/ (their tests aside) or proto/ (`git diff
--stat COMMIT HEAD -- CODE_PATHS` is not empty), or made with uncommitted changes there."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.method.report import CODE_PATHS

RESULTS = Path(__file__).resolve().parents[1] / "results"
README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = "<!-- bench:table -->"
END = "<!-- /bench:table -->"
# The markers and what lies between them (nothing, in a README never generated).
_BLOCK = rf"{re.escape(BEGIN)}\n(?:(.*?)\n)?{re.escape(END)}"
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


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, check=True
    ).stdout


def stale(data: dict[str, Any], repo: Path = README.parent) -> str:
    """Why a run's figures no longer describe HEAD's code in `repo` ("" when they do):
    services/ or proto/ changed since its commit, or it ran with uncommitted changes
    there."""
    machine = data["machine"]
    commit = machine["git commit"].partition(" ")[0]
    uncommitted = machine.get("uncommitted code", "")
    if uncommitted:
        return f"run with uncommitted changes in {uncommitted}"
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        return f"its commit is unknown ({commit!r})"
    try:
        diff = _git(repo, "diff", "--stat", commit, "HEAD", "--", *CODE_PATHS).strip()
    except (OSError, subprocess.CalledProcessError):
        return f"its commit {commit[:12]} is not in this repository"
    if diff:
        return f"services/, proto/ changed since {commit[:12]}: {diff.splitlines()[-1].strip()}"
    return ""


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


def _run_lines(
    data: dict[str, Any], where: str, numbers: list[int] | None, why_stale: str
) -> list[str]:
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
    if why_stale:
        lines += [f"**Stale: {why_stale}. Its rows describe older code: run it again.**", ""]
    if run.get("quick"):
        lines += [
            "**Smoke run (`--quick`: two repeats, fewer adapters, on a loaded machine): "
            "these figures show the benchmark works, not how fast loraserve is.**",
            "",
        ]
    return lines


def render(paths: Path | Sequence[Path]) -> str:
    """The markdown block (without markers): each benchmark's figures from the newest
    of `paths` (results.json files, oldest first) that has it."""
    ordered = [paths] if isinstance(paths, Path) else list(paths)
    if not ordered:
        return NO_RUNS
    chosen = sources(ordered)
    used = [p for p in reversed(ordered) if p in chosen.values()]  # newest first
    several = len(used) > 1
    lines = [
        "<!-- generated by `python -m bench.method.readme_table --write README.md` from "
        f"{', '.join(_where(p) for p in used)}; do not edit -->"
    ]
    sections: list[tuple[dict[str, Any], str]] = []
    for path in used:
        data: dict[str, Any] = json.loads(path.read_text())
        mine = sorted(n for n, p in chosen.items() if p == path and n)  # 0: a set-up
        why_stale = stale(data)
        lines += _run_lines(data, _where(path), mine if several else None, why_stale)
        sections += [(s, why_stale) for s in data["sections"] if chosen[s["number"]] == path]
    lines += [
        "| # | figure | measured (median [95 % interval] n=repeats) | goal | verdict |",
        "|---|---|---|---|---|",
    ]
    for section, why_stale in sorted(sections, key=lambda pair: pair[0]["number"]):
        lines += section_rows(section, bool(why_stale))
    return "\n".join(lines)


def _verdict_cell(verdict: str, is_stale: bool) -> str:
    shown = _SHOWN.get(verdict, verdict)
    return f"**stale** ({verdict})" if is_stale else shown


def section_rows(section: dict[str, Any], is_stale: bool) -> list[str]:
    """One benchmark's rows: a failure, its goals, its noise figures."""
    number = section["number"]
    rows = []
    if section["error"]:
        rows.append(
            f"| {number} | {_cell(section['title'])} | failed: "
            f"{_cell(section['error'][:200])} | | {_verdict_cell('missed', is_stale)} |"
        )
    for goal in section["goals"]:
        rows.append(
            f"| {number} | {_cell(goal['figure'])} | {_cell(goal['value'])} | "
            f"{_cell(goal['target'])} | {_verdict_cell(verdict_of(goal), is_stale)} |"
        )
    for noise in section.get("noises", []):
        limit = noise["limit"]
        target = f"within ±{limit:.0%}" if limit is not None else "recorded"
        e = noise["estimate"]
        value = f"{e['value']:.3f} [{e['low']:.3f}, {e['high']:.3f}] n={e['n']}"
        rows.append(
            f"| {number} | noise: {_cell(noise['figure'])} | {value} | {target} | "
            f"{_verdict_cell(noise['verdict'], is_stale)} |"
        )
    return rows


def stale_rows(paths: Sequence[Path], repo: Path = README.parent) -> dict[int, str]:
    """Benchmark number -> why its rows in the table are stale, for every stale one."""
    chosen = sources(list(paths))
    reasons = {path: stale(json.loads(path.read_text()), repo) for path in set(chosen.values())}
    return {number: reasons[path] for number, path in chosen.items() if reasons[path]}


def readme_block(text: str) -> str | None:
    """What the README holds between the markers now (None: no markers)."""
    match = re.search(_BLOCK, text, re.S)
    return (match.group(1) or "") if match else None


def update(text: str, table: str) -> str:
    if readme_block(text) is None:
        raise ValueError(f"README has no {BEGIN} ... {END} block")
    block = f"{BEGIN}\n{table}\n{END}"
    return re.sub(_BLOCK, lambda _: block, text, flags=re.S)


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
    table = render(args.results or runs())
    if args.write:
        args.write.write_text(update(args.write.read_text(), table))
        print(f"updated {args.write}")
    else:
        print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
