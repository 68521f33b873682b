"""`python -m bench --dry-run [--engine gpu] [--only ...]`: what every benchmark would
start, started by nobody. Each server's command line comes from the same function the
run uses (placeholder ports and a scratch directory), the baselines' flags are checked
to parse back into engine A's exact engine arguments, and with `--engine gpu` every
benchmark's engines up at once must fit the device together (bench.method.gpu.MEMORY_LIMIT),
so the GPU path is exercised on a machine without a GPU."""

from __future__ import annotations

import itertools
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.fleet.rig import replica_argv
from bench.fleet.routing import FleetScale
from bench.inference.against_vllm import baseline_commands
from bench.method import gpu
from bench.method.runs import Scale
from bench.real import models
from bench.rig import baselines, procs
from bench.rig.stack import ENGINE_A, ENGINE_B, ENGINE_C, PROFILES, Stack, tenant
from bench.rig.vllm_args import differences, loraserve_engine_args, parse_vllm_flags

LOADGEN = [sys.executable, "-m", "bench.load.loadgen"]


@dataclass
class BenchPlan:
    """What one benchmark starts: its servers' command lines, and how many engines are
    up at once while it runs."""

    number: int
    servers: dict[str, list[str]] = field(default_factory=dict)
    engines_at_once: int = 0

    def memory_share(self, engine: str) -> float:
        share = PROFILES[engine].gpu_memory_utilization or 0.0
        return self.engines_at_once * share


def _ports() -> Iterator[int]:
    return itertools.count(50100)


def _stack(engine: str, name: str) -> Stack:
    scratch = Path(tempfile.gettempdir()) / "bench-plan"
    stack = Stack(scratch, scratch / name, PROFILES[engine])
    stack.plan_models()
    return stack


def _store(ports: Iterator[int], bucket: str = "bench") -> dict[str, list[str]]:
    moto = next(ports)
    return {
        "moto": procs.moto_argv(moto),
        "adapterstore serve": procs.store_argv(next(ports), f"http://127.0.0.1:{moto}", bucket),
    }


def _inference(engine: str) -> dict[int, BenchPlan]:
    """Benchmarks 1-5, 7, 8 and 13: one stack, engines A, B, C and the baselines."""
    ports = _ports()
    stack = _stack(engine, "inference")
    store = _store(ports)
    stack.argv_a = stack.argv("engine-a", next(ports), ENGINE_A, next(ports))
    a = {"inference serve (engine A, bench.rig.engine_host)": stack.argv_a, **store}
    b = stack.argv("engine-b", next(ports), ENGINE_B)
    eight = {tenant(i): stack.adapters[tenant(i)] for i in range(8)}
    raw_b = baselines.commands(b, eight, 0, 0).raw
    cmds = baseline_commands(stack, serve_port=next(ports), grpc_port=next(ports))
    _check_flags(stack, cmds)
    vllm = {"vllm serve": cmds.serve, "vLLM gRPC": cmds.grpc, "raw AsyncLLM": cmds.raw}
    c = {"inference serve (engine C)": stack.argv("engine-c", next(ports), ENGINE_C)}
    load = {"load generator": LOADGEN}
    with_b = {**a, "inference serve (engine B)": b, "AsyncLLM alone, B's flags": raw_b, **load}
    return {
        1: BenchPlan(1, {**a, **load}, 1),
        2: BenchPlan(2, with_b, 3),
        7: BenchPlan(7, with_b, 3),
        8: BenchPlan(8, {**a, **vllm, **load}, 4),
        13: BenchPlan(13, {**a, **vllm, **load}, 4),
        3: BenchPlan(3, {**a, **c, **load}, 2),
        4: BenchPlan(4, {**a, **load}, 1),
        5: BenchPlan(5, a, 1),
    }


def _check_flags(stack: Stack, cmds: baselines.Commands) -> None:
    """The baselines' flags parse back into engine A's engine arguments."""
    drift = differences(loraserve_engine_args(stack.argv_a), parse_vllm_flags(cmds.flags))
    unset = differences(
        parse_vllm_flags(["--model", str(stack.model_dir)]), _defaults(str(stack.model_dir))
    )
    if set(drift) - set(unset):
        raise AssertionError(f"baseline engine arguments differ from engine A's: {drift}")


def _defaults(model: str) -> object:
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs(model=model)


def _swap_servers(stack: Stack, engine_config: procs.EngineConfig) -> dict[str, list[str]]:
    from bench.swap.arms import BARE_SWAP, SWAP
    from bench.swap.vs_vllm import loraserve_argv

    ports = _ports()
    servers = _store(ports)
    grpc_port, http_port = next(ports), next(ports)
    servers["inference serve (loraserve)"] = loraserve_argv(
        stack, engine_config, grpc_port, http_port
    )
    source = stack.adapters["swap-v0"]
    serve = baselines.serve_command(
        stack.argv("loraserve", grpc_port, engine_config),
        {SWAP: source, BARE_SWAP: source},
        next(ports),
    )
    servers["vllm serve (runtime LoRA updates)"] = serve
    return servers


def _others(engine: str) -> dict[int, BenchPlan]:
    """Benchmarks 6, 9, 10, 11, 12, 21 and 22."""
    from bench.tiers.rig import Rig

    ports = _ports()
    stack = _stack(engine, "others")
    stack.adapters["swap-v0"] = stack.adapters[tenant(0)]
    fleet = {
        f"inference serve (replica {i})": replica_argv(stack, i, next(ports), next(ports))
        for i in range(FleetScale().replicas)
    }
    rig = Rig(stack, cache_size=1 << 28, prefetch=32)
    tiers = {
        "inference serve (a fresh replica, one at a time)": rig.argv(
            "tiers", "127.0.0.1:1", next(ports), next(ports)
        )
    }
    return {
        6: BenchPlan(6, _store(ports), 0),
        9: BenchPlan(9, _swap_servers(stack, ENGINE_A), 2),
        10: BenchPlan(
            10, {**_store(ports), **fleet, "load generator": LOADGEN}, FleetScale().replicas
        ),
        11: BenchPlan(11, {**_store(ports), **tiers, "load generator": LOADGEN}, 1),
        12: BenchPlan(12, _store(ports), 0),
        21: BenchPlan(21, {"moto": procs.moto_argv(next(ports))}, 0),
        # 22 runs its load in the benchmark's own process.
        22: BenchPlan(22, {**_store(ports), **fleet}, FleetScale().replicas),
    }


def _real(engine: str) -> dict[int, BenchPlan]:
    """The real profile's benchmarks 14-18."""
    from bench.real.fleet_caches import BOTO, CACHES, fetch_argv
    from bench.real.suite import ENGINE, stall_argv

    ports = _ports()
    stack = _stack(engine, "real")
    stack.model_dir = models.model_dir()
    stack.adapters["swap-v0"] = models.adapter_dir(0)
    store = _store(ports)
    endpoint = store["adapterstore serve"][3].partition("=")[2]
    fetchers = {
        f"bench.real.fleet_fetch, {arm} (one of 16 processes)": fetch_argv(
            arm, "127.0.0.1:1", ["fleet-0@1"], endpoint, "bench", ["blobs/sha256/HEX"]
        )
        for arm in (CACHES, BOTO)
    }
    stall = {"inference serve (replica)": stall_argv(stack, next(ports)), "load generator": LOADGEN}
    swaps = _swap_servers(stack, ENGINE)
    return {
        14: BenchPlan(14, store, 0),
        15: BenchPlan(15, {**store, **fetchers}, 0),
        16: BenchPlan(16, swaps, 2),
        17: BenchPlan(17, swaps, 2),
        18: BenchPlan(18, {**_store(ports), **stall}, 1),
    }


def _trust(engine: str) -> dict[int, BenchPlan]:
    """Benchmarks 19 and 20: one replica under a flood; two store and replica pairs."""
    from bench.trust.suite import ENGINE

    ports = _ports()
    stack = _stack(engine, "trust")
    store = _store(ports)
    flood = [*stack.argv("flood-replica", next(ports), ENGINE), "--max-engine-requests=16"]
    trust = ["--signature-policy=require", "--trusted-signers=bench=KEY.pub"]
    verify = {
        "adapterstore serve (require)": [*_store(ports)["adapterstore serve"], *trust],
        "inference serve (off)": stack.argv("verify-off", next(ports), ENGINE),
        "inference serve (require)": [*stack.argv("verify-require", next(ports), ENGINE), *trust],
    }
    return {
        19: BenchPlan(19, {**store, "inference serve (replica)": flood}, 1),
        20: BenchPlan(20, {**store, **verify}, 2),
    }


def plans(engine: str) -> dict[int, BenchPlan]:
    """Every benchmark's plan for `--engine ENGINE`."""
    return {**_inference(engine), **_others(engine), **_real(engine), **_trust(engine)}


def check_gpu(all_plans: dict[int, BenchPlan]) -> list[str]:
    """What keeps the GPU run from fitting: memory shares over the limit, benchmarks in
    neither the run nor the left-out list, a total budget over the window."""
    problems = [
        f"benchmark {p.number}: {p.engines_at_once} engines x "
        f"{PROFILES['gpu'].gpu_memory_utilization} of the device > {gpu.MEMORY_LIMIT}"
        for p in all_plans.values()
        if p.memory_share("gpu") > gpu.MEMORY_LIMIT
    ]
    unplanned = set(all_plans) - set(gpu.BUDGETS_S) - set(gpu.LEFT_OUT)
    if unplanned:
        problems.append(f"benchmarks neither in the GPU run nor left out: {sorted(unplanned)}")
    if gpu.expected_total_s() > gpu.WINDOW_S:
        problems.append(f"GPU budgets sum to {gpu.expected_total_s()} s > {gpu.WINDOW_S} s")
    return problems


def print_plan(engine: str, wanted: set[int], scale: Scale) -> None:
    profile = PROFILES[engine]
    all_plans = plans(engine)
    print(f"engine profile: {engine}; environment {profile.env}")
    print(f"benchmarks: {sorted(wanted)}; scale {asdict(scale)}")
    for number in sorted(wanted):
        plan = all_plans[number]
        share = plan.memory_share(engine)
        print(
            f"\n== benchmark {number}: {plan.engines_at_once} engine(s) at once"
            + (f", {share:.2f} of the GPU" if share else "")
        )
        for name, argv in plan.servers.items():
            print(f"  {name}:\n    " + " ".join(argv))
    if engine == "gpu":
        print(
            f"\nGPU run (make bench-gpu): --only {gpu.only_argument()}; budgets (s) "
            f"{gpu.BUDGETS_S}, phases {gpu.PHASES_S}: {gpu.expected_total_s()} s of "
            f"{gpu.WINDOW_S}"
        )
        for number, why in sorted(gpu.LEFT_OUT.items()):
            print(f"  left out: {number}: {why}")
        problems = check_gpu(all_plans)
        if problems:
            raise SystemExit("the GPU run does not fit: " + "; ".join(problems))
