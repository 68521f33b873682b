"""What tracing costs a Generate while it is off: ns per request of the span code path
(issue 57), against the same loop with that path removed.

    python -m bench.micro.tracing_off [--requests 200000] [--repeats 7] [--json OUT]

Tracing off is what a replica runs without `--otlp-traces-endpoint` (nor the `OTEL_*`
endpoint variables). Each arm is a loop of `--requests` iterations doing per request
what the serving path does for tracing, with the real objects: the front's
`TraceOrigin`, `GenerateSpans.start`, the two `waiting` wrappers (turn and lease),
`leased`, the two log lines' `current()`, `finished`, `engine_headers`, `end`, and the
registry's `PublishTraces.take` on the lease. Arms:

- `removed`: the loop with none of that (what the code did before tracing);
- `off`: the calls, the caller sending no trace context (gRPC metadata of 3 entries);
- `off+traceparent`: the same, the caller sending a `traceparent` (left unread).

Each repeat runs every arm once, their order rotating, with the garbage collector off
during each loop. A figure is the median over the repeats of the per-repeat difference
from `removed` (ns per request), with a 95 % bootstrap interval (bench.method.stats);
each arm's own ns per request is printed beside it. Figures are CPU-bound and stable on
a quiet machine; no tokens/s is measured (a CPU engine's noise would hide the effect).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.method.paired import rotated
from bench.method.stats import Estimate, median_interval, paired_difference
from loraserve.common.revisions.names import parse_adapter_ref
from loraserve.inference.adapters import Lease
from loraserve.inference.adapters.published import PublishTraces
from loraserve.inference.serving import GRPC_GENERATE_SPAN, FinishReason, TraceOrigin
from loraserve.inference.serving.chunks import Outcome
from loraserve.inference.serving.spans import GenerateSpans

ARMS = ("removed", "off", "off+traceparent")
BASE_ARM = "removed"
METADATA = (
    ("user-agent", "grpc-python-asyncio/1.85.1"),
    ("x-request-id", "bench"),
    ("grpc-accept-encoding", "identity,deflate,gzip"),
)
TRACEPARENT = ("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
_HELD = contextlib.nullcontext()


def _request_loop(metadata: Sequence[tuple[str, str]] | None) -> Callable[[int], None]:
    """`requests` iterations of one request's tracing calls (None: none of them), on
    the same objects a Generate has."""
    spans = GenerateSpans()
    published = PublishTraces()
    lease = Lease("alpha", 3, None)
    ref = parse_adapter_ref("alpha")
    outcome = Outcome(revision=3, generated=16, admitted=1.0, submitted=1.0, first_token=2.0)

    def no_split(_: str) -> None:
        return None

    def removed(requests: int) -> None:
        for _ in range(requests):
            pass

    def off(requests: int) -> None:
        assert metadata is not None
        for _ in range(requests):
            origin = TraceOrigin(metadata, GRPC_GENERATE_SPAN)
            traced = spans.start(origin, "alpha", "bench-request")
            traced.waiting("gate", _HELD)
            traced.waiting("adapter", _HELD)
            published.take("alpha", 3)
            traced.leased(lease, ref, no_split, 8)
            with traced.current():
                pass
            traced.engine_headers()
            traced.finished(FinishReason.LENGTH)
            with traced.current():
                pass
            traced.end("OK", outcome, None)

    return removed if metadata is None else off


def _loops() -> dict[str, Callable[[int], None]]:
    return {
        "removed": _request_loop(None),
        "off": _request_loop(METADATA),
        "off+traceparent": _request_loop((*METADATA, TRACEPARENT)),
    }


def _ns_per_request(loop: Callable[[int], None], requests: int) -> float:
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter_ns()
        loop(requests)
        return (time.perf_counter_ns() - started) / requests
    finally:
        gc.enable()


def measure(requests: int, repeats: int) -> dict[str, list[float]]:
    """Each arm's ns per request in every repeat, the arms interleaved."""
    loops = _loops()
    for loop in loops.values():
        loop(min(requests, 10_000))  # warm-up: caches, the interpreter's specialization
    samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for repeat in range(repeats):
        for arm in rotated(ARMS, repeat):
            samples[arm].append(_ns_per_request(loops[arm], requests))
    return samples


def figures(samples: dict[str, list[float]]) -> dict[str, dict[str, Estimate]]:
    """Per arm: its ns per request, and its difference from `removed` (per repeat)."""
    base = samples[BASE_ARM]
    return {
        arm: {
            "ns_per_request": median_interval(values),
            "overhead_ns": paired_difference(values, base),
        }
        for arm, values in samples.items()
    }


def table(results: dict[str, dict[str, Estimate]]) -> str:
    lines = [f"{'arm':<18} {'ns per Generate':<34} {'overhead vs removed (ns)':<34}"]
    for arm, figure in results.items():
        lines.append(
            f"{arm:<18} {figure['ns_per_request'].text('.0f'):<34} "
            f"{figure['overhead_ns'].text('.0f') if arm != BASE_ARM else '-':<34}"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.micro.tracing_off", description=__doc__)
    parser.add_argument("--requests", type=int, default=200_000, help="iterations per arm run")
    parser.add_argument("--repeats", type=int, default=7, help="paired repeats (at least 5)")
    parser.add_argument("--json", type=Path, help="also write the samples and figures here")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.repeats < 5 or args.requests < 1:
        raise SystemExit("--repeats must be at least 5 and --requests at least 1")
    samples = measure(args.requests, args.repeats)
    results = figures(samples)
    print(table(results))
    if args.json is not None:
        out: dict[str, Any] = {
            "requests": args.requests,
            "repeats": args.repeats,
            "samples": samples,
            "figures": {
                arm: {name: dataclasses.asdict(est) for name, est in figure.items()}
                for arm, figure in results.items()
            },
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
