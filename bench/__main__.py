"""`python -m bench [--profile default|real] [--only 6,1,...] [--quick] [--engine cpu|gpu]
[--update-readme]`: runs the benchmarks, prints each one's tables as it finishes, writes
the run's results under bench/results/<UTC date-time>/ (results.json, report.md, PNG
plots; the servers' logs in its logs/, not committed) and prints the README table with
its figures. `--dry-run` prints what every benchmark would start (engines, baselines,
stores, their flags) without starting anything."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import logging
import sys
import time
from pathlib import Path

from bench.fleet import routing
from bench.method import gpu, readme_table
from bench.method.report import Report
from bench.method.runs import scale_for
from bench.rig.stack import PROFILES
from bench.store import s3_libs, transfers_events

RESULTS = Path(__file__).resolve().parent / "results"
# Each profile's benchmarks, in the order a run makes them.
PROFILE_BENCHMARKS = {
    "default": (6, 21, 1, 2, 7, 8, 13, 3, 4, 5, 9, 10, 22, 11, 12),
    "real": (14, 15, 16, 17, 18),
    "trust": (19, 20),
}
INFERENCE = frozenset({1, 2, 3, 4, 5, 7, 8, 13})
REAL = frozenset(PROFILE_BENCHMARKS["real"])
TRUST = frozenset(PROFILE_BENCHMARKS["trust"])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--profile",
        choices=tuple(PROFILE_BENCHMARKS),
        default="default",
        help="default: the wider tiny model and its adapters; real: a locally built "
        "Llama-shaped base (hidden 2048, 8 layers, vocab 32k) with rank-64 adapters; "
        "trust: fair admission under a flood, and signature verification's cost (issue 26)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated benchmark numbers, of either profile (default: all of the profile's)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats and requests (a smoke run)"
    )
    parser.add_argument(
        "--engine",
        choices=("cpu", "gpu"),
        default="cpu",
        help="cpu: the vLLM CPU build; gpu: CUDA vLLM, engines sharing one GPU, fewer repeats",
    )
    parser.add_argument(
        "--gpu-run",
        action="store_true",
        help="the benchmarks of the 15-minute GPU run (bench/method/gpu.py), each within its "
        "budget",
    )
    parser.add_argument(
        "--stand-in",
        action="store_true",
        help="with --engine gpu: the GPU run's workloads on the CPU engine, no budgets (its "
        "time on this machine is the GPU run's expected time)",
    )
    parser.add_argument(
        "--results", type=Path, help="output directory (default: bench/results/<UTC date-time>)"
    )
    parser.add_argument(
        "--update-readme",
        action="store_true",
        help="write the README table with this run's figures (the benchmarks it did not run keep "
        "the newest committed run's)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would start, start nothing"
    )
    return parser


def _wanted(args: argparse.Namespace) -> set[int]:
    if args.gpu_run and not args.only:
        return set(gpu.BUDGETS_S)
    if not args.only:
        return set(PROFILE_BENCHMARKS[args.profile])
    known = {n for numbers in PROFILE_BENCHMARKS.values() for n in numbers}
    wanted = {int(n) for n in args.only.split(",") if n.strip()}
    if wanted - known:
        raise SystemExit(f"no benchmark {sorted(wanted - known)}; known: {sorted(known)}")
    return wanted


async def _main(args: argparse.Namespace, results: Path) -> Report:
    wanted = _wanted(args)
    run = {
        "command": " ".join(["python -m bench", *sys.argv[1:]]),
        "engine": args.engine,
        "profile": args.profile,
        "stand-in": args.stand_in,
        "quick": args.quick,
        "benchmarks": sorted(wanted),
    }
    report = Report(results, run)
    budget = gpu.Budget(enabled=args.engine == "gpu" and not args.stand_in)
    started = time.monotonic()
    try:
        if 6 in wanted:
            settings = transfers_events.StoreSettings(repeats=2, events=6) if args.quick else None
            await transfers_events.run(report, settings or transfers_events.StoreSettings())
        if 21 in wanted:
            await s3_libs.run(report, quick=args.quick)
        inference = wanted & INFERENCE
        if inference:
            from bench.inference import suite as inference_suite

            scale = scale_for(args.engine, args.quick)
            await inference_suite.run(report, inference, scale, args.engine, budget)
        if 9 in wanted:
            from bench.swap import vs_vllm

            await vs_vllm.run(report, quick=args.quick, engine=args.engine)
        if 10 in wanted:
            await routing.run(report, quick=args.quick, engine=args.engine)
        if 22 in wanted:
            from bench.fleet import rollout

            await rollout.run(report, quick=args.quick, engine=args.engine)
        if 11 in wanted:
            from bench.tiers import thousands as tiers_thousands

            await tiers_thousands.run(report, quick=args.quick, engine=args.engine)
        if 12 in wanted:
            from bench.store import thousands as store_thousands

            await store_thousands.run(report, quick=args.quick)
        if wanted & TRUST:
            from bench.trust import suite as trust_suite

            await trust_suite.run(report, set(wanted), quick=args.quick, engine=args.engine)
        if wanted & REAL:
            from bench.real import suite as real_suite

            await real_suite.run(
                report, wanted & REAL, quick=args.quick, engine=args.engine, budget=budget
            )
    finally:
        report.total_seconds = time.monotonic() - started
        path = report.write()
        print(f"\nresults: {path.parent}/  ({report.total_seconds:.0f} s)", flush=True)
    return report


def _show_table(results: Path, update_readme: bool) -> None:
    # Benchmarks this run did not make keep the figures of the newest run that made them.
    paths = readme_table.with_run(results / "results.json")
    table = readme_table.render(paths)
    if update_readme:
        readme = readme_table.README
        readme.write_text(readme_table.update_readme(readme.read_text(), paths))
        print(f"\nREADME table updated with {results}/:\n\n{table}")
    else:
        print(
            "\nThe README table with this run (`python -m bench.method.readme_table --write "
            f"README.md` or `make bench-readme` puts it there):\n\n{table}"
        )


def main() -> int:
    args = _parser().parse_args()
    if args.stand_in:
        if args.engine != "gpu":
            raise SystemExit("--stand-in runs the GPU run's workloads: give --engine gpu")
        # The gpu scales and plan, on the CPU build's engine settings.
        PROFILES["gpu"] = dataclasses.replace(PROFILES["cpu"], name="gpu (CPU engine standing in)")
    if args.dry_run:
        from bench.plan import print_plan

        print_plan(args.engine, _wanted(args), scale_for(args.engine, args.quick))
        return 0
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%MZ")
    results = args.results or RESULTS / stamp
    report = asyncio.run(_main(args, results))
    _show_table(results, args.update_readme)
    return 1 if any(s.error for s in report.sections) else 0


if __name__ == "__main__":
    raise SystemExit(main())
