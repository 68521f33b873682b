"""Benchmark 13: the gRPC stream at wire speed (issue 28's loop).

loraserve's gRPC (the raw generated stub, one message per token), loraserve's OpenAI
front and `vllm serve` (aiohttp, streamed /v1/completions), same engine settings and 8
adapters, 64-token requests: closed loops of 32 and 128 clients (tokens/s and the front
process's CPU per 1,000 tokens), 8 clients (TTFT and inter-token latency), an open loop
at a fixed Poisson rate (latency at a load below saturation), and the client side:
`InferenceClient.stream` against loraserve vs `openai.AsyncOpenAI` against vllm serve,
CPU of the load generator's process per 1,000 tokens.
"""

from __future__ import annotations

import time

from bench.inference.throughput import EIGHT, engine_line
from bench.load.loadclient import Arm, LoadGenerator
from bench.load.targets import Target
from bench.method import paired
from bench.method.paired import Runs
from bench.method.report import Report, Section
from bench.method.runs import Scale, closed, poisson, schedule_for
from bench.rig import baselines
from bench.rig.stack import ENGINE_A, Stack

NUMBER = 13
STUB = "loraserve gRPC (raw stub)"
FRONT = "loraserve OpenAI front"
SERVE = "vllm serve"
CLIENT_OURS = "InferenceClient.stream -> loraserve gRPC"
CLIENT_SDK = "openai.AsyncOpenAI -> vllm serve"


def _name(arm: str, clients: int | str) -> str:
    return f"{arm}, {clients}"


def _arms(stack: Stack, found: baselines.Baselines, scale: Scale) -> list[Arm]:
    host = stack.host
    assert host is not None
    work = schedule_for(EIGHT, scale, max_tokens=64)
    stub = Target("grpc_stub", host.child.address)
    front = Target("openai", stack.openai_url, stack.base_model_name)
    serve = Target("openai", found.serve_url, str(stack.model_dir))
    sdk = Target("openai_sdk", found.serve_url, str(stack.model_dir))
    arms: list[Arm] = []
    for clients in (scale.concurrency, scale.wide_concurrency, scale.narrow_concurrency):
        arms += [
            closed(_name(STUB, clients), stub, work, clients, host.pid),
            closed(_name(FRONT, clients), front, work, clients, host.pid),
            closed(_name(SERVE, clients), serve, work, clients, found.serve_pid),
        ]
    rate = f"Poisson {scale.poisson_rate:g}/s"
    arms += [
        poisson(_name(STUB, rate), stub, work, scale.poisson_rate, host.pid),
        poisson(_name(FRONT, rate), front, work, scale.poisson_rate, host.pid),
        poisson(_name(SERVE, rate), serve, work, scale.poisson_rate, found.serve_pid),
        closed(CLIENT_OURS, Target("grpc", host.child.address), work, scale.concurrency, host.pid),
        closed(CLIENT_SDK, sdk, work, scale.concurrency, found.serve_pid),
    ]
    return arms


async def stream_speed(
    report: Report, stack: Stack, gen: LoadGenerator, scale: Scale, found: baselines.Baselines
) -> Runs | None:
    section = report.section(NUMBER, "The gRPC stream at wire speed (issue 28's loop)")
    started = time.monotonic()
    if not found.serve_url:
        section.error = f"vllm serve did not start: {found.errors.get('vllm serve', '')[-500:]}"
        report.print_section(section)
        return None
    arms = _arms(stack, found, scale)
    section.workload += [arm.describe() for arm in arms]
    section.workload += [
        scale.describe() + "; the load generator runs in its own process",
        engine_line(stack, "A", ENGINE_A) + " (loraserve's gRPC and OpenAI fronts, one process)",
        "front CPU: the server's own process (not the engine core) over the window per "
        "1,000 tokens; client CPU: the load generator's process the same way",
    ]
    noise = _name(STUB, scale.concurrency)
    runs = await paired.paired(gen, arms, scale.timing, scale.repeats, noise=noise)
    paired.arm_table(section, runs)
    paired.arm_table(
        section,
        runs,
        "Client side: the load generator's CPU per 1,000 tokens",
        (
            ("tok/s", "tokens_per_s", ".0f"),
            ("client CPU ms / 1k tok", "client_cpu_ms_per_1k", ".0f"),
        ),
    )
    _goals(section, runs, scale)
    # The noise arm runs 32 clients: its tokens/s and CPU noise bound the goals on those
    # metrics; its latency noise (another load than the 8-client goals') is recorded.
    paired.close(section, runs, ("tokens_per_s", "front_cpu_ms_per_1k", "client_cpu_ms_per_1k"))
    for metric in ("ttft_p50_ms", "itl_p50_ms"):
        section.noise(
            f"{noise}, {metric}, measured twice",
            runs.ratio(noise, noise + paired.AGAIN, metric),
            f"{metric} at {scale.concurrency} clients",
        )
    section.seconds = time.monotonic() - started
    report.print_section(section)
    return runs


def _goals(section: Section, runs: Runs, scale: Scale) -> None:
    c = scale.concurrency
    paired.ratio_goal(
        section,
        runs,
        f"gRPC / {SERVE}: front CPU per 1,000 tokens, {c} clients",
        (_name(STUB, c), _name(SERVE, c)),
        "front_cpu_ms_per_1k",
        "<=",
        0.5,
    )
    for clients in (c, scale.wide_concurrency):
        for other in (FRONT, SERVE):
            paired.ratio_goal(
                section,
                runs,
                f"gRPC / {other} tok/s, {clients} clients",
                (_name(STUB, clients), _name(other, clients)),
                "tokens_per_s",
                ">=",
                1.0,
            )
    n = scale.narrow_concurrency
    for label, metric in (("TTFT p50", "ttft_p50_ms"), ("ITL p50", "itl_p50_ms")):
        paired.ratio_goal(
            section,
            runs,
            f"gRPC / OpenAI front {label}, {n} clients",
            (_name(STUB, n), _name(FRONT, n)),
            metric,
            "<=",
            1.0,
        )
    rate = f"Poisson {scale.poisson_rate:g}/s"
    for label, metric in (("TTFT p99", "ttft_p99_ms"), ("ITL p99", "itl_p99_ms")):
        section.reported(
            f"gRPC / {SERVE} {label}, open loop at {scale.poisson_rate:g} requests/s",
            runs.ratio(_name(STUB, rate), _name(SERVE, rate), metric),
            ".2f",
        )
    paired.ratio_goal(
        section,
        runs,
        "InferenceClient / OpenAI SDK: client CPU per 1,000 tokens",
        (CLIENT_OURS, CLIENT_SDK),
        "client_cpu_ms_per_1k",
        "<=",
        0.5,
    )
