"""`python -m bench --dry-run [--engine gpu]`: what a run would start, started by nobody.
It derives every server's flags as the run would (and checks that vLLM parses the
baselines' flags back into engine A's exact engine arguments), so the GPU path is
exercised on a machine without a GPU."""

from __future__ import annotations

import tempfile
from dataclasses import asdict
from pathlib import Path

from bench.bench_vllm import baseline_commands
from bench.runs import Scale
from bench.stack import ENGINE_A, ENGINE_B, ENGINE_C, PROFILES, Stack
from bench.vllm_args import differences, loraserve_engine_args, parse_vllm_flags

# Placeholder ports: nothing listens in a dry run.
_PORTS = {"engine-a": 50100, "engine-b": 50101, "engine-c": 50102, "openai": 50103}


def plan(engine: str) -> dict[str, list[str]]:
    """Command lines by server name, for the run `--engine ENGINE` would make."""
    stack = Stack(Path(tempfile.gettempdir()) / "bench-plan", Path("bench-work"), PROFILES[engine])
    stack.plan_models()
    stack.argv_a = stack.argv("engine-a", _PORTS["engine-a"], ENGINE_A, _PORTS["openai"])
    cmds = baseline_commands(stack, serve_port=50104, grpc_port=50105)
    drift = differences(loraserve_engine_args(stack.argv_a), parse_vllm_flags(cmds.flags))
    unset = differences(
        parse_vllm_flags(["--model", str(stack.model_dir)]), _defaults(str(stack.model_dir))
    )
    if set(drift) - set(unset):
        raise AssertionError(f"baseline engine arguments differ from engine A's: {drift}")
    return {
        "inference serve (engine A, bench.engine_host)": stack.argv_a,
        "inference serve (engine B)": stack.argv("engine-b", _PORTS["engine-b"], ENGINE_B),
        "inference serve (engine C)": stack.argv("engine-c", _PORTS["engine-c"], ENGINE_C),
        "vllm serve": cmds.serve,
        "vLLM gRPC": cmds.grpc,
        "raw AsyncLLM": cmds.raw,
    }


def _defaults(model: str) -> object:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(model=model)


def print_plan(engine: str, wanted: set[int], scale: Scale) -> None:
    profile = PROFILES[engine]
    print(f"engine profile: {engine}; environment {profile.env}")
    print(f"benchmarks: {sorted(wanted)}; scale {asdict(scale)}")
    for name, argv in plan(engine).items():
        print(f"\n{name}:\n  " + " ".join(argv))
