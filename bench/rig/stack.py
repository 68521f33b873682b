"""The running system the inference benchmarks share: moto S3, `adapterstore serve`,
the wider tiny model with its adapters, engine A (max_loras 8, in bench.rig.engine_host so
it can also be driven in-process) and engine B (max_loras 1, plain `inference serve`)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import grpc

from bench.rig import procs, storeops
from loraserve.adapterctl.adapter_dir import AdapterFiles
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.processes.services import free_port
from loraserve.tiny.adapters import TinyAdapterSpec, build_tiny_adapter
from loraserve.tiny.model import TinyModelSpec, build_tiny_model

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "bench"
BUCKET = "bench-inference"
# Wider than the test model so that LoRA rank / hidden size (8 / 512) is near a real
# model's (64 / 4096); head_dim stays 64, the smallest vLLM's CPU attention takes.
MODEL_SPEC = TinyModelSpec(
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=8,
)
RANK = 8
TENANTS = 32
SWAP_VARIANTS = 4
# The longest an engine may take to start: minutes when the machine is busy.
ENGINE_START_S = 600.0
ENGINE_A = procs.EngineConfig(max_loras=8, max_cpu_loras=32, max_lora_rank=RANK)
ENGINE_B = procs.EngineConfig(max_loras=1, max_cpu_loras=8, max_lora_rank=RANK)
# The user's question in benchmark 3: what if I just raise the slots to the adapters?
ENGINE_C = procs.EngineConfig(max_loras=32, max_cpu_loras=32, max_lora_rank=RANK)


@dataclass(frozen=True)
class EngineProfile:
    """Where the engines run: the vLLM CPU build, or CUDA vLLM with several engines
    sharing one GPU (A, the baselines and C are up at once)."""

    name: str
    env: dict[str, str]
    gpu_memory_utilization: float | None

    def engine(self, config: procs.EngineConfig) -> procs.EngineConfig:
        return dataclasses.replace(config, gpu_memory_utilization=self.gpu_memory_utilization)


PROFILES = {
    "cpu": EngineProfile("cpu", {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}, None),
    # Up to four engines share the device at once (A and the three baselines).
    "gpu": EngineProfile("gpu", {"VLLM_NO_USAGE_STATS": "1"}, 0.15),
}
ENGINE_ENV = PROFILES["cpu"].env


def tenant(i: int) -> str:
    return f"t{i:02d}"


def model_description() -> str:
    s = MODEL_SPEC
    return (
        f"tiny Llama, hidden {s.hidden_size}, {s.num_hidden_layers} layers, "
        f"{s.num_attention_heads} heads, vocab {s.vocab_size}, fp32; adapters rank {RANK} on "
        "all 7 projections (PEFT, random weights)"
    )


@dataclass
class Host:
    """A process serving an engine through bench.load.thin (engine A in bench.rig.engine_host, or
    bench.rig.raw_engine), with the control pipe it reports readiness on."""

    child: procs.Child
    control: IO[str]
    log_dir: Path
    thin_ports: dict[str, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """The serving process (its engine core is a child)."""
        return self.child.process.pid

    def thin(self, arm: str) -> str:
        """The address of the thin server of `arm` ("direct", "generator", "raw")."""
        return f"127.0.0.1:{self.thin_ports[arm]}"

    async def ready(self, timeout: float) -> None:
        line = await asyncio.wait_for(asyncio.to_thread(self.control.readline), timeout)
        if not line:
            tail = (self.log_dir / f"{self.child.name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.child.name} ended before it was ready:\n{tail}")
        self.thin_ports = {k: int(v) for k, v in json.loads(line).get("thin", {}).items()}

    def stop(self) -> None:
        if self.child.process.stdin is not None:
            self.child.process.stdin.close()
        try:
            self.child.process.wait(30)
        except Exception:
            self.child.stop()
        self.control.close()


@dataclass
class Stack:
    results_dir: Path
    work: Path
    profile: EngineProfile = PROFILES["cpu"]
    model_dir: Path = field(init=False)
    adapters: dict[str, Path] = field(default_factory=dict)
    files: dict[Path, AdapterFiles] = field(default_factory=dict)
    children: list[procs.Child] = field(default_factory=list)
    store: procs.Child | None = None
    store_endpoint: str = ""
    store_channel: grpc.aio.Channel | None = None
    host: Host | None = None
    # Engine A's `inference serve` flags and its OpenAI front (the baselines copy them).
    argv_a: list[str] = field(default_factory=list)
    openai_url: str = ""
    engine_b: procs.Child | None = None
    engine_c: procs.Child | None = None

    @property
    def logs(self) -> Path:
        return self.results_dir / "logs"

    def plan_models(self) -> None:
        """Where build_models() puts the model and the tenants' adapters, building nothing."""
        self.model_dir = CACHE / "model-h512-l4"
        self.adapters.update({tenant(i): CACHE / f"t{i:02d}-r{RANK}" for i in range(TENANTS)})

    def build_models(self) -> None:
        cache = CACHE
        self.model_dir = build_tiny_model(cache / "model-h512-l4", MODEL_SPEC)
        for i in range(TENANTS):
            self.adapters[tenant(i)] = build_tiny_adapter(
                self.model_dir, cache / f"t{i:02d}-r{RANK}", TinyAdapterSpec(rank=RANK, seed=i)
            )
        for v in range(SWAP_VARIANTS):
            self.adapters[f"swap-v{v}"] = build_tiny_adapter(
                self.model_dir, cache / f"swap{v}-r{RANK}", TinyAdapterSpec(rank=RANK, seed=100 + v)
            )

    async def start_store(self, log_level: str = "WARNING", extra: tuple[str, ...] = ()) -> None:
        moto, endpoint = await asyncio.to_thread(procs.start_moto, self.logs, BUCKET)
        self.children.append(moto)
        self.store_endpoint = endpoint
        self.store = await procs.start_store(self.logs, endpoint, BUCKET, log_level, extra=extra)
        self.children.append(self.store)
        self.store_channel = grpc.aio.insecure_channel(self.store.address)

    async def push(self, name: str, source: str | None = None) -> int:
        """Pushes the adapter built as `source` (default: `name`) as a new revision of `name`."""
        assert self.store_channel is not None
        directory = self.adapters[source or name]
        if directory not in self.files:
            self.files[directory] = await storeops.hashed(directory)
        return await storeops.push(
            storeops.store_stub(self.store_channel), name, self.files[directory]
        )

    @property
    def base_model_name(self) -> str:
        """The base model's name on loraserve's OpenAI front."""
        return self.model_dir.name

    def argv(
        self, name: str, port: int, engine: procs.EngineConfig, openai_port: int | None = None
    ) -> list[str]:
        """`inference serve` flags for a benchmark engine on this stack's profile."""
        store = self.store.address if self.store is not None else "127.0.0.1:1"
        return procs.serve_argv(
            name,
            port,
            model=self.model_dir,
            store=store,
            cache_dir=self.work / f"cache-{name}",
            engine=self.profile.engine(engine),
            openai_port=openai_port,
        )

    def _argv(
        self, name: str, port: int, engine: procs.EngineConfig, openai_port: int | None = None
    ) -> list[str]:
        shutil.rmtree(self.work / f"cache-{name}", ignore_errors=True)
        return self.argv(name, port, engine, openai_port)

    async def start_engines(self, with_b: bool) -> float:
        """Starts A (and B) at once; returns the seconds until both were SERVING."""
        started = time.monotonic()
        port = free_port()
        openai_port = free_port()
        self.argv_a = self._argv("engine-a", port, ENGINE_A, openai_port)
        self.openai_url = f"http://127.0.0.1:{openai_port}"
        child, read_fd = procs.start_engine_host(
            self.logs, "engine-a", self.argv_a, f"127.0.0.1:{port}", self.profile.env
        )
        self.children.append(child)
        self.host = Host(child, os.fdopen(read_fd), self.logs)
        waits = [self.host.ready(ENGINE_START_S)]
        if with_b:
            self.engine_b = self._start_plain("engine-b", ENGINE_B)
            waits.append(procs.wait_serving(self.engine_b, self.logs, ENGINE_START_S))
        await asyncio.gather(*waits)
        return time.monotonic() - started

    def stop_b(self) -> None:
        if self.engine_b is not None:
            self.engine_b.stop()
            self.engine_b = None

    def start_c(self) -> procs.Child:
        """Engine C (max_loras 32, plain `inference serve`); wait_serving() it before use."""
        self.engine_c = self._start_plain("engine-c", ENGINE_C)
        return self.engine_c

    def _start_plain(self, name: str, engine: procs.EngineConfig) -> procs.Child:
        """A plain `inference serve` on this stack; wait_serving() it before use."""
        port = free_port()
        child = procs.start_inference(
            self.logs, name, self._argv(name, port, engine), f"127.0.0.1:{port}", self.profile.env
        )
        self.children.append(child)
        return child

    def stop_c(self) -> None:
        if self.engine_c is not None:
            self.engine_c.stop()
            self.engine_c = None

    async def close(self) -> None:
        if self.store_channel is not None:
            await self.store_channel.close()
        if self.host is not None:
            self.host.stop()
        for child in reversed(self.children):
            child.stop()
        shutil.rmtree(self.work, ignore_errors=True)


async def current_revisions(address: str, *, loaded: bool = True) -> dict[str, int]:
    """name -> the revision a server routes it to (current and READY; with `loaded`
    False also AVAILABLE: routed, loaded by its first request), by ListAdapters."""
    async with grpc.aio.insecure_channel(address) as channel:
        response = await pb_grpc.InferenceServiceStub(channel).ListAdapters(
            pb.ListAdaptersRequest()
        )
    states = {pb.ADAPTER_STATE_READY} | (set() if loaded else {pb.ADAPTER_STATE_AVAILABLE})
    return {a.name: a.revision for a in response.adapters if a.current and a.state in states}


async def wait_routed(
    address: str, wanted: dict[str, int], timeout: float = 120, *, loaded: bool = True
) -> None:
    """Until `address` routes every name of `wanted` to its revision or a newer one
    (`loaded` False: also lazily, before its first request loads it)."""
    deadline = time.monotonic() + timeout
    while True:
        routed = await current_revisions(address, loaded=loaded)
        if all(routed.get(name, 0) >= rev for name, rev in wanted.items()):
            return
        if time.monotonic() > deadline:
            missing = sorted(n for n, r in wanted.items() if routed.get(n, 0) < r)
            raise TimeoutError(f"{address}: not routed after {timeout:.0f} s: {missing}")
        await asyncio.sleep(0.05)
