"""Benchmark 8: loraserve against what users would run instead, same engine settings,
same workload, one run: `vllm serve --enable-lora` (OpenAI HTTP), vLLM's own gRPC server
(base model: its Generate has no LoRA field) and vLLM's AsyncLLM alone in its own
process (driven through bench.load.thin). Next to tokens/s, every server arm records the CPU
time of its front process (the API/gRPC process, not the engine core) per 1,000 tokens:
on a fast engine that is what caps a server, and it is far steadier here than tokens/s."""

from __future__ import annotations

import time

from bench.inference.throughput import EIGHT, engine_line, grpc_target
from bench.load.loadclient import Arm, LoadGenerator
from bench.load.targets import Target
from bench.method import paired
from bench.method.paired import Runs
from bench.method.report import Report, Section
from bench.method.runs import Scale, closed, schedule_for
from bench.method.stats import Op
from bench.rig import baselines
from bench.rig.stack import ENGINE_A, Stack, tenant

GRPC = "loraserve gRPC"
FRONT = "loraserve OpenAI front"
SERVE = "vllm serve (OpenAI)"
RAW = "raw AsyncLLM"
GRPC_BASE = "loraserve gRPC, base model"
VLLM_GRPC = "vLLM gRPC, base model"
CPU = "front_cpu_ms_per_1k"


def baseline_commands(stack: Stack, serve_port: int = 0, grpc_port: int = 0) -> baselines.Commands:
    """The baselines' command lines for engine A's flags and the first eight adapters."""
    adapters = {tenant(i): stack.adapters[tenant(i)] for i in range(8)}
    return baselines.commands(stack.argv_a, adapters, serve_port, grpc_port)


def describe_baselines(section: Section, cmds: baselines.Commands) -> None:
    section.workload += [
        "every baseline gets vLLM's flags derived from engine A's settings: "
        + " ".join(cmds.flags[2:]),
        f"{SERVE}: python -m {baselines.OPENAI_SERVER} with --lora-modules (the same 8 "
        "adapter directories), no access log; streamed /v1/completions with token-id "
        "prompts over HTTP/1.1 (aiohttp), one connection per stream",
        f"{FRONT}: engine A's --openai-listen, the same HTTP client and requests",
    ]


def _arms(stack: Stack, found: baselines.Baselines, scale: Scale) -> list[Arm]:
    host = stack.host
    assert host is not None
    adapters = schedule_for(EIGHT, scale)
    base = schedule_for(("",), scale)
    c = scale.concurrency
    arms = [
        closed(GRPC, grpc_target(host.child.address), adapters, c, host.pid),
        closed(
            FRONT, Target("openai", stack.openai_url, stack.base_model_name), adapters, c, host.pid
        ),
        closed(GRPC_BASE, grpc_target(host.child.address), base, c, host.pid),
    ]
    if found.serve_url:
        target = Target("openai", found.serve_url, str(stack.model_dir))
        arms.append(closed(SERVE, target, adapters, c, found.serve_pid))
    if found.raw is not None:
        arms.append(closed(RAW, Target("thin", found.raw.thin("raw")), adapters, c, found.raw.pid))
    if found.grpc_address:
        arms.append(
            closed(VLLM_GRPC, Target("vllm_grpc", found.grpc_address), base, c, found.grpc_pid)
        )
    return arms


async def against_vllm(
    report: Report, stack: Stack, gen: LoadGenerator, scale: Scale, found: baselines.Baselines
) -> Runs:
    section = report.section(8, "Against vLLM itself: vllm serve, vLLM gRPC, raw AsyncLLM")
    started = time.monotonic()
    arms = _arms(stack, found, scale)
    section.workload += [arm.describe() for arm in arms]
    section.workload += [
        scale.describe() + "; the load generator runs in its own process",
        engine_line(stack, "A", ENGINE_A),
        f"{VLLM_GRPC}: python -m {baselines.GRPC_SERVER} (smg-grpc-servicer), streamed "
        "Generate with token ids",
        f"{RAW}: AsyncLLM.from_engine_args in its own process (bench.rig.raw_engine), adapters "
        "added up front, driven through bench.load.thin",
        "front CPU = user + system CPU seconds of the server's own process (engine A's "
        "server process; vllm serve's API process; the raw engine's process), not of the "
        "engine-core child, over the window, per 1,000 streamed tokens",
    ]
    if found.commands is not None:
        describe_baselines(section, found.commands)
    for name, error in found.errors.items():
        section.notes.append(f"{name} could not start (a miss): {error[-1500:]}")
    runs = await paired.paired(gen, arms, scale.timing, scale.repeats, noise=GRPC)
    paired.arm_table(section, runs)
    _goals(section, runs)
    paired.close(section, runs, ("tokens_per_s", CPU))
    section.notes.append(
        "The client runs on the same machine as the servers: every arm's load generator "
        "shares the two cores with the engine and the server; on this CPU engine all "
        "servers are engine-bound, so tokens/s ratios sit near 1 and the CPU per token of "
        "the front process is what tells the servers apart."
    )
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return runs


# (figure, numerator, denominator, metric, op, threshold, clear): issue 23's goals.
GOALS: tuple[tuple[str, str, str, str, Op, float, float | None], ...] = (
    (f"{GRPC} / {SERVE} tok/s", GRPC, SERVE, "tokens_per_s", ">=", 1.0, 0.97),
    (f"{FRONT} / {SERVE} tok/s", FRONT, SERVE, "tokens_per_s", ">=", 1.0, 0.97),
    (f"{GRPC} / {SERVE}: front CPU per 1,000 tokens", GRPC, SERVE, CPU, "<=", 0.5, None),
    (f"{FRONT} / {SERVE}: front CPU per 1,000 tokens", FRONT, SERVE, CPU, "<=", 1.0, None),
    (f"{GRPC_BASE} / {VLLM_GRPC} tok/s", GRPC_BASE, VLLM_GRPC, "tokens_per_s", ">=", 1.0, 0.97),
    (f"{GRPC} / {RAW} tok/s", GRPC, RAW, "tokens_per_s", ">=", 0.97, None),
)


def _goals(section: Section, runs: Runs) -> None:
    for figure, numerator, denominator, metric, op, threshold, clear in GOALS:
        paired.ratio_goal(
            section, runs, figure, (numerator, denominator), metric, op, threshold, clear=clear
        )
