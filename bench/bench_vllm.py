"""Benchmark 8: loraserve against what users would run instead, same engine settings,
same workload, one run: `vllm serve --enable-lora` (OpenAI HTTP), vLLM's own gRPC server
(base model: its Generate has no LoRA field) and vLLM's AsyncLLM used directly in its
own process."""

from __future__ import annotations

import time

from bench import baselines
from bench.bench_throughput import (
    HEADERS,
    Results,
    arm_rows,
    bar_plot,
    eight_and_base,
    engine_line,
    tps,
)
from bench.report import Goal, Report, Section
from bench.runs import Arm, Scale, grpc_arm, host_arm, interleaved, openai_arm, vllm_grpc_arm
from bench.stack import ENGINE_A, Stack, tenant
from bench.stats import ratio
from bench.workload import Workload
from loraserve.testing.processes import free_port

GRPC = "loraserve gRPC"
FRONT = "loraserve OpenAI front"
SERVE = "vllm serve (OpenAI)"
RAW = "raw AsyncLLM"
GRPC_BASE = "loraserve gRPC, base model"
VLLM_GRPC = "vLLM gRPC, base model"

# (numerator, denominator, goal, threshold, format): each ratio of tokens/s reported.
GOALS = (
    (GRPC, SERVE, ">= 1.5", 1.5, ".2f"),
    (FRONT, SERVE, ">= 1.0", 1.0, ".2f"),
    (GRPC_BASE, VLLM_GRPC, ">= 1.0", 1.0, ".2f"),
    (GRPC, RAW, ">= 0.97", 0.97, ".3f"),
)


def baseline_commands(stack: Stack, serve_port: int = 0, grpc_port: int = 0) -> baselines.Commands:
    """The baselines' command lines for engine A's flags and the first eight adapters."""
    adapters = {tenant(i): stack.adapters[tenant(i)] for i in range(8)}
    return baselines.commands(stack.argv_a, adapters, serve_port, grpc_port)


async def against_vllm(report: Report, stack: Stack, scale: Scale) -> Results:
    section = report.section(8, "Against vLLM itself: vllm serve, vLLM gRPC, raw AsyncLLM")
    started = time.monotonic()
    assert stack.host is not None
    adapters, base = eight_and_base(scale)
    serve_port, grpc_port = free_port(), free_port()
    cmds = baseline_commands(stack, serve_port, grpc_port)
    section.workload += [
        "adapters: " + adapters.describe(),
        "base: " + base.describe(),
        engine_line(stack, "A", ENGINE_A),
        "every baseline gets vLLM's flags derived from engine A's settings: "
        + " ".join(cmds.flags[2:]),
        f"{SERVE}: python -m {baselines.OPENAI_SERVER} with --lora-modules (the same 8 "
        "adapter directories), no access log; streamed /v1/completions with token-id "
        "prompts over HTTP/1.1 (aiohttp), one connection per stream",
        f"{FRONT}: engine A's --openai-listen, the same HTTP client and requests",
        f"{VLLM_GRPC}: python -m {baselines.GRPC_SERVER} (smg-grpc-servicer), streamed "
        "Generate with token ids; its default INFO line per request left on (tens of "
        "lines a run: negligible)",
        f"{RAW}: AsyncLLM.from_engine_args in its own process (bench.raw_engine), adapters "
        "added up front",
        f"{scale.repeats} repeats, arm order rotated each repeat; medians reported",
    ]
    found = await baselines.start(
        stack.logs, cmds, stack.profile.env, serve_port=serve_port, grpc_port=grpc_port
    )
    try:
        for name, error in found.errors.items():
            section.notes.append(f"{name} could not run: {error[-1500:]}")
        arms = _arms(stack, found, adapters, base)
        await _warm_up(arms)
        results = await interleaved(arms, scale.repeats)
    finally:
        found.stop()
    section.table("Throughput and TTFT", HEADERS, arm_rows(results))
    section.record_repeats(results)
    bar_plot(report, section, results, "against_vllm.png", "Throughput: loraserve vs vLLM")
    _goals(section, results)
    section.notes.append(
        "The client runs on the same machine as the servers: the HTTP arms pay aiohttp's "
        "parsing, the gRPC arms grpcio's, on the cores the engines use."
    )
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return results


def _arms(
    stack: Stack, found: baselines.Baselines, adapters: Workload, base: Workload
) -> dict[str, tuple[Arm, Workload]]:
    assert stack.host is not None
    address = stack.host.child.address
    arms: dict[str, tuple[Arm, Workload]] = {
        GRPC: (grpc_arm(address), adapters),
        FRONT: (openai_arm(stack.openai_url, stack.base_model_name), adapters),
        GRPC_BASE: (grpc_arm(address), base),
    }
    if found.serve_url:
        arms[SERVE] = (openai_arm(found.serve_url, str(stack.model_dir)), adapters)
    if found.raw is not None:
        arms[RAW] = (host_arm(found.raw, "raw"), adapters)
    if found.grpc_address:
        arms[VLLM_GRPC] = (vllm_grpc_arm(found.grpc_address), base)
    return arms


async def _warm_up(arms: dict[str, tuple[Arm, Workload]]) -> None:
    """One short pass per arm, so first-use costs (adapter loads, connections) land outside."""
    for arm, workload in arms.values():
        await arm(Workload(workload.adapters, 8, 2 * len(workload.adapters), 4))


def _goals(section: Section, results: Results) -> None:
    for numerator, denominator, target, threshold, fmt in GOALS:
        figure = f"{numerator} / {denominator} tok/s"
        if denominator not in results:
            section.goals.append(Goal(figure, "did not run", target, None))
            continue
        value = ratio(tps(results, numerator), tps(results, denominator))
        section.goal(figure, value, target, value >= threshold, fmt)
