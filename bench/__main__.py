"""`python -m bench [--only 6,1,...] [--quick]`: runs the benchmarks, prints each one's
tables as it finishes, and writes bench/results/report.md with PNG plots."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from pathlib import Path

from bench import bench_fleet, store_bench
from bench.report import Report

RESULTS = Path(__file__).resolve().parent / "results"
ALL = (6, 1, 2, 7, 3, 4, 5, 8)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--only",
        default=",".join(map(str, ALL)),
        help="comma-separated benchmark numbers (default: all, in the order 6,1,2,7,3,4,5,8)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer repeats and requests (a smoke run)"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="output directory")
    return parser


async def _main(args: argparse.Namespace) -> Report:
    wanted = {int(n) for n in args.only.split(",") if n.strip()}
    report = Report(args.results)
    started = time.monotonic()
    try:
        if 6 in wanted:
            settings = store_bench.StoreSettings(repeats=1, events=5) if args.quick else None
            await store_bench.run(report, settings or store_bench.StoreSettings())
        inference = wanted & {1, 2, 3, 4, 5, 7}
        if inference:
            from bench import inference_bench

            await inference_bench.run(report, inference, quick=args.quick)
        if 8 in wanted:
            await bench_fleet.run(report, quick=args.quick)
    finally:
        report.total_seconds = time.monotonic() - started
        path = report.write()
        print(f"\nreport: {path}  ({report.total_seconds:.0f} s)", flush=True)
    return report


def main() -> int:
    # Before any channel exists: gRPC reads it once (benchmark 8's ring_hash arm).
    bench_fleet.enable_ring_hash()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    report = asyncio.run(_main(_parser().parse_args()))
    return 1 if any(s.error for s in report.sections) else 0


if __name__ == "__main__":
    raise SystemExit(main())
