"""Benchmark 9: hot swap, loraserve's whole path vs vLLM's own in-place reload.

vLLM arm: `vllm serve` with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; `POST
/v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true}` with new weights
-> first token produced from them. loraserve arm: the `adapterctl push` process (start-up,
hashing, upload) -> store -> S3 -> watch event -> download -> engine load -> route ->
first token from the new revision. Every push has weights never seen before (no
deduplication). Both arms use the same probe (bench.swap.probe); a swap no probe saw
within its timeout is counted, not dropped. The same figures serve the real profile's
hot and cold swaps (bench.real.suite).
"""

from __future__ import annotations

import asyncio
import math
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.method.report import Cell, Report, Section
from bench.method.stats import median, median_interval, paired_ratio, unpaired_ratio
from bench.rig import baselines, procs
from bench.rig.procs import EngineConfig
from bench.rig.stack import BUCKET, ENGINE_A, PROFILES, Stack
from bench.swap.arms import (
    ARMS,
    BACKGROUND_STREAMS,
    BARE,
    BARE_STEPS,
    BARE_SWAP,
    LORASERVE,
    SWAP,
    VLLM,
    Servers,
    Swap,
    rounds,
)
from bench.swap.probe import BACKGROUND_TOKENS, PROBE_TIMEOUT_S, STAGES
from bench.swap.push_spans import profile_table
from loraserve.testing.otlp import OtlpReceiver, otlp_receiver
from loraserve.testing.processes.services import free_port

GOAL_S = 0.2
# loraserve's push -> first token over the bare path's, at most (issue 55).
BARE_GOAL = 1.5


def loraserve_argv(stack: Stack, engine: EngineConfig, grpc_port: int, http_port: int) -> list[str]:
    """The swap benchmarks' `inference serve` flags: INFO logs (its stages), OpenAI front."""
    return [
        *stack.argv("loraserve", grpc_port, engine),
        f"--openai-listen=127.0.0.1:{http_port}",
        "--log-level=INFO",
    ]


SERVING = (
    f"both servers stream {BACKGROUND_STREAMS} requests of the base model at once "
    f"throughout ({BACKGROUND_TOKENS} tokens each, closed loop), as a replica serves while "
    "someone publishes"
)
TRACED = (
    "the store and the replica export their spans to an OTLP receiver in the benchmark "
    "process (batched, off the request path); adapterctl runs untraced, as users run it"
)
BARE_PATH = (
    "bare path: boto3 upload_file of the adapter's files to the same S3, boto3 get_object "
    "of them to disk (in a worker process of its own, as the store and adapterctl run in "
    "theirs), then vllm serve's load_lora_adapter of that copy (in place on its loaded "
    "swap-bare, or under a new name)"
)


# vllm serve takes new LoRA weights at run time only with this.
RUNTIME_LORA = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


async def start_servers(
    stack: Stack, engine: EngineConfig, otlp: OtlpReceiver | None = None
) -> Servers:
    """loraserve (INFO logs, OpenAI front) and `vllm serve` (runtime LoRA updates), both
    serving `swap` as built in `stack.adapters["swap-v0"]` (vllm serve `swap-bare` too,
    the bare arm's); with `otlp`, the store and the replica export their spans to it."""
    traced = (f"--otlp-traces-endpoint={otlp.endpoint}",) if otlp is not None else ()
    await stack.start_store(log_level="INFO", extra=traced)
    await stack.push(SWAP, "swap-v0")
    grpc_port, http_port = free_port(), free_port()
    shutil.rmtree(stack.work / "cache-loraserve", ignore_errors=True)
    argv = [*loraserve_argv(stack, engine, grpc_port, http_port), *traced]
    env = stack.profile.env
    lora = procs.start_inference(stack.logs, "loraserve", argv, f"127.0.0.1:{grpc_port}", env)
    stack.children.append(lora)
    source = stack.adapters["swap-v0"]
    vllm = baselines.start_serve(
        stack.logs,
        stack.argv("loraserve", grpc_port, engine),
        {SWAP: source, BARE_SWAP: source},
        {**env, **RUNTIME_LORA},
    )
    stack.children.append(vllm)
    lora_url = f"http://127.0.0.1:{http_port}"
    await asyncio.gather(
        baselines.http_ready(lora, stack.logs, 900, lora_url),
        baselines.http_ready(vllm, stack.logs, 900),
    )
    assert stack.store is not None
    return Servers(
        vllm.address,
        lora_url,
        stack.store.address,
        stack.store_endpoint,
        BUCKET,
        stack.logs,
        source,
        stack.work,
        str(stack.model_dir),
        stack.base_model_name,
        otlp,
    )


def _seen(values: list[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def figures(
    section: Section, swaps: list[Swap], startup: list[float], goal_s: float | None
) -> None:
    """Tables, goals (loraserve within BARE_GOAL of the bare path; its median below
    `goal_s`, None: reported), noise."""
    by_arm = {arm: [s for s in swaps if s.arm == arm] for arm in ARMS}
    first = {arm: [s.first_token for s in mine] for arm, mine in by_arm.items()}
    rows: list[list[Cell]] = []
    for arm, values in first.items():
        seen = _seen(values)
        rows.append(
            [
                arm,
                len(values),
                len(values) - len(seen),
                median_interval([v * 1000 for v in seen]).text(".0f"),
            ]
        )
        section.record(arm, [{"first_token_s": s.first_token, **s.milestones} for s in by_arm[arm]])
    section.record_values("adapterctl start-up (--help)", "seconds", startup)
    section.table(
        "Swap start -> first token from the new weights (ms)",
        ["arm", "swaps", "missed", "median [interval]"],
        rows,
    )
    _stage_table(section, by_arm[LORASERVE], startup)
    _bare_table(section, by_arm[BARE])
    profile_table(section, [s.spans for s in by_arm[LORASERVE]])
    lora, bare, vllm = first[LORASERVE], first[BARE], first[VLLM]
    pushed = median_interval(_seen(lora))
    if goal_s is None:
        section.reported(f"{LORASERVE}: swap -> first token (s)", pushed, ".3f")
    else:
        section.goal(f"{LORASERVE}: swap -> first token (s)", pushed, "<", goal_s, ".3f")
    section.reported(f"{BARE}: swap -> first token (s)", median_interval(_seen(bare)), ".3f")
    section.reported(f"{VLLM}: swap -> first token (s)", median_interval(_seen(vllm)), ".3f")
    section.goal(
        "loraserve / bare S3 + vLLM, rounds paired",
        paired_ratio(lora, bare),
        "<=",
        BARE_GOAL,
        ".2f",
        metric="swap_s",
    )
    section.reported("loraserve / vLLM load alone, rounds paired", paired_ratio(lora, vllm), ".2f")
    missed = sum(math.isnan(v) for values in first.values() for v in values)
    section.check(f"swaps not seen within {PROBE_TIMEOUT_S:.0f} s", missed, "0", not missed)
    halves = unpaired_ratio(lora[1::2], lora[::2])
    section.noise(f"{LORASERVE}: odd / even rounds", halves, "swap_s")


def _bare_table(section: Section, bare: list[Swap]) -> None:
    section.table(
        "The bare path: median time of each step after the swap started (ms)",
        ["step", "at", "since the previous"],
        _milestone_rows(bare, BARE_STEPS, "first token from the new weights"),
    )


def _stage_table(section: Section, lora: list[Swap], startup: list[float]) -> None:
    labels = [label for label, _, _ in STAGES] + ["adapterctl exited"]
    section.table(
        "loraserve's path: median time of each milestone after the push started (ms)",
        ["milestone", "at", "since the previous"],
        [
            ["adapterctl start-up (`--help`, measured apart)", median(startup) * 1000, ""],
            *_milestone_rows(lora, labels, "first token from the new revision"),
        ],
    )


def _milestone_rows(swaps: list[Swap], labels: Sequence[str], first_label: str) -> list[list[Cell]]:
    """Each milestone's median over the swaps that saw it, in the order they came, then
    the first token: (label, ms after the start, ms after the previous one)."""
    milestones = sorted(
        ((median(_seen([s.milestones.get(m, math.nan) for s in swaps])), m) for m in labels),
        key=lambda pair: pair[0],
    )
    milestones.append((median(_seen([s.first_token for s in swaps])), first_label))
    rows: list[list[Cell]] = []
    previous = 0.0
    for at, label in milestones:
        rows.append([label, at * 1000, (at - previous) * 1000])
        previous = at
    return rows


async def run(report: Report, *, quick: bool, engine: str = "cpu") -> None:
    section = report.section(9, "Hot swap: adapterctl push vs vLLM load_inplace")
    started = time.monotonic()
    # Two of each of the arms' six orders.
    repeats = 3 if quick else 12
    stack = Stack(
        report.results_dir, Path(tempfile.mkdtemp(prefix="bench-swap-vllm-")), PROFILES[engine]
    )
    try:
        stack.build_models()
        async with otlp_receiver() as otlp:
            servers = await start_servers(stack, ENGINE_A, otlp)
            swaps, startup = await rounds(servers, repeats, cold=False)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        report.print_section(section)
        raise
    finally:
        await stack.close()
    section.workload += [
        f"{repeats} swaps per arm, the arms in each of their six orders in turn; engine "
        "settings of engine A on both "
        f"(max_loras {ENGINE_A.max_loras}, max_cpu_loras {ENGINE_A.max_cpu_loras}, rank "
        f"{ENGINE_A.max_lora_rank}, fp32, eager; vllm serve's flags derived from "
        "loraserve's settings, bench/rig/vllm_args.py)",
        SERVING,
        "every swap new weights (rank 8, all 7 projections, never pushed before)",
        TRACED,
        BARE_PATH,
        "probe: one-token greedy streamed /v1/completions for the adapter, back to back; "
        "swap latency = swap start -> first token of the first probe answered by the new "
        f"weights (compared by token id); not seen within {PROBE_TIMEOUT_S:.0f} s = missed",
    ]
    figures(section, swaps, startup, GOAL_S)
    section.notes.append(
        "The vLLM arm reloads weights already on the server's disk; the loraserve arm "
        "publishes them from the user's directory through the store and S3 to every "
        "replica, which keep serving the old revision until the new one is loaded."
    )
    section.seconds = time.monotonic() - started
    report.print_section(section)
