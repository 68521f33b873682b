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
from pathlib import Path

from bench.method.report import Cell, Report, Section
from bench.method.stats import median, median_interval, paired_ratio, unpaired_ratio
from bench.rig import baselines, procs
from bench.rig.procs import EngineConfig
from bench.rig.stack import ENGINE_A, PROFILES, Stack
from bench.swap.arms import ARMS, SWAP, Servers, Swap, rounds
from bench.swap.probe import PROBE_TIMEOUT_S, STAGES
from loraserve.testing.processes.services import free_port

GOAL_S = 0.2


def loraserve_argv(stack: Stack, engine: EngineConfig, grpc_port: int, http_port: int) -> list[str]:
    """The swap benchmarks' `inference serve` flags: INFO logs (its stages), OpenAI front."""
    return [
        *stack.argv("loraserve", grpc_port, engine),
        f"--openai-listen=127.0.0.1:{http_port}",
        "--log-level=INFO",
    ]


# vllm serve takes new LoRA weights at run time only with this.
RUNTIME_LORA = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


async def start_servers(stack: Stack, engine: EngineConfig) -> Servers:
    """loraserve (INFO logs, OpenAI front) and `vllm serve` (runtime LoRA updates), both
    serving `swap` as built in `stack.adapters["swap-v0"]`."""
    await stack.start_store(log_level="INFO")
    await stack.push(SWAP, "swap-v0")
    grpc_port, http_port = free_port(), free_port()
    shutil.rmtree(stack.work / "cache-loraserve", ignore_errors=True)
    argv = loraserve_argv(stack, engine, grpc_port, http_port)
    env = stack.profile.env
    lora = procs.start_inference(stack.logs, "loraserve", argv, f"127.0.0.1:{grpc_port}", env)
    stack.children.append(lora)
    vllm = baselines.start_serve(
        stack.logs,
        stack.argv("loraserve", grpc_port, engine),
        {SWAP: stack.adapters["swap-v0"]},
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
        stack.logs,
        stack.adapters["swap-v0"],
        stack.work,
    )


def _seen(values: list[float]) -> list[float]:
    return [v for v in values if not math.isnan(v)]


def figures(
    section: Section, swaps: list[Swap], startup: list[float], goal_s: float | None
) -> None:
    """Tables, goal (loraserve's median below `goal_s`; None: reported), noise."""
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
    _stage_table(section, by_arm[ARMS[1]], startup)
    lora, vllm = first[ARMS[1]], first[ARMS[0]]
    if goal_s is None:
        section.reported(f"{ARMS[1]}: swap -> first token (s)", median_interval(_seen(lora)), ".3f")
    else:
        section.goal(
            f"{ARMS[1]}: swap -> first token (s)", median_interval(_seen(lora)), "<", goal_s, ".3f"
        )
    section.reported(f"{ARMS[0]}: swap -> first token (s)", median_interval(_seen(vllm)), ".3f")
    section.reported("loraserve / vLLM, rounds paired", paired_ratio(lora, vllm), ".2f")
    missed = sum(math.isnan(v) for values in first.values() for v in values)
    section.check(f"swaps not seen within {PROBE_TIMEOUT_S:.0f} s", missed, "0", not missed)
    section.noise(f"{ARMS[1]}: odd / even rounds", unpaired_ratio(lora[1::2], lora[::2]), "swap_s")


def _stage_table(section: Section, lora: list[Swap], startup: list[float]) -> None:
    """loraserve's milestones in the order they came (medians of the swaps seen)."""
    labels = [label for label, _, _ in STAGES] + ["adapterctl exited"]
    milestones = sorted(
        ((median(_seen([s.milestones.get(m, math.nan) for s in lora])), m) for m in labels),
        key=lambda pair: pair[0],
    )
    stage_rows: list[list[Cell]] = [
        ["adapterctl start-up (`--help`, measured apart)", median(startup) * 1000, ""],
    ]
    previous = 0.0
    for at, label in milestones:
        stage_rows.append([label, at * 1000, (at - previous) * 1000])
        previous = at
    first = median(_seen([s.first_token for s in lora]))
    stage_rows.append(
        ["first token from the new revision", first * 1000, (first - previous) * 1000]
    )
    section.table(
        "loraserve's path: median time of each milestone after the push started (ms)",
        ["milestone", "at", "since the previous"],
        stage_rows,
    )


async def run(report: Report, *, quick: bool, engine: str = "cpu") -> None:
    section = report.section(9, "Hot swap: adapterctl push vs vLLM load_inplace")
    started = time.monotonic()
    repeats = 3 if quick else 10
    stack = Stack(
        report.results_dir, Path(tempfile.mkdtemp(prefix="bench-swap-vllm-")), PROFILES[engine]
    )
    try:
        stack.build_models()
        servers = await start_servers(stack, ENGINE_A)
        swaps, startup = await rounds(servers, repeats, cold=False)
    except Exception as exc:
        section.error = f"{type(exc).__name__}: {exc}"
        report.print_section(section)
        raise
    finally:
        await stack.close()
    section.workload += [
        f"{repeats} swaps per arm, arms alternated; engine settings of engine A on both "
        f"(max_loras {ENGINE_A.max_loras}, max_cpu_loras {ENGINE_A.max_cpu_loras}, rank "
        f"{ENGINE_A.max_lora_rank}, fp32, eager; vllm serve's flags derived from "
        "loraserve's settings, bench/rig/vllm_args.py); idle servers",
        "every swap new weights (rank 8, all 7 projections, never pushed before)",
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
