"""vLLM's own OpenAI server (what users run instead of loraserve), started with the
engine settings of a loraserve benchmark server, and a streaming /v1/completions caller
that drives it or loraserve's OpenAI front alike."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path

import aiohttp

from bench import procs
from bench.workload import Caller
from loraserve.testing.processes import free_port

# The CPU build's `vllm` console script fails on its package-name lookup; the module runs.
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def vllm_serve_argv(
    port: int, model: Path, adapters: Mapping[str, Path], engine: procs.EngineConfig
) -> list[str]:
    """`vllm serve` flags matching procs.serve_argv's engine settings."""
    argv = [
        sys.executable,
        "-m",
        VLLM_SERVER_MODULE,
        f"--model={model}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--enable-lora",
        f"--max-loras={engine.max_loras}",
        f"--max-cpu-loras={engine.max_cpu_loras}",
        f"--max-lora-rank={engine.max_lora_rank}",
        f"--max-model-len={engine.max_model_len}",
        "--dtype=float32",
        "--enforce-eager",
        "--seed=0",
        "--disable-uvicorn-access-log",
    ]
    if adapters:
        argv += ["--lora-modules", *(f"{name}={path}" for name, path in adapters.items())]
    return argv


def start_vllm_serve(
    log_dir: Path,
    name: str,
    model: Path,
    adapters: Mapping[str, Path],
    engine: procs.EngineConfig,
    env: Mapping[str, str],
) -> procs.Child:
    """Starts vLLM's OpenAI server; `wait_http_ready` it before use."""
    port = free_port()
    child = procs._spawn(name, vllm_serve_argv(port, model, adapters, engine), log_dir, dict(env))
    child.address = f"http://127.0.0.1:{port}"
    return child


async def wait_http_ready(child: procs.Child, url: str, log_dir: Path, timeout: float) -> None:
    """Polls GET `url`/health until 200 (both servers answer 503 or refuse until ready)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        while True:
            procs._check_alive(child, log_dir)
            try:
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{child.name} not ready after {timeout:.0f} s")
            await asyncio.sleep(0.3)


def completions_caller(session: aiohttp.ClientSession, base_url: str) -> Caller:
    """Streams /v1/completions (greedy, ignore_eos, prompt as token ids); yields
    (1, 0) per event with text, as the gRPC caller yields per chunk, and the tokens no
    such event carried (text-less tokens) from the usage event at the end."""

    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        body = {
            "model": adapter,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with session.post(f"{base_url}/v1/completions", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:300]}")
            seen = 0
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(f"stream error: {event['error']}")
                for choice in event["choices"]:
                    if choice.get("text"):
                        seen += 1
                        yield 1, 0
                if event.get("usage"):
                    rest = event["usage"]["completion_tokens"] - seen
                    if rest > 0:
                        yield rest, 0

    return call


async def first_text(
    session: aiohttp.ClientSession, base_url: str, model: str, prompt: Sequence[int], tokens: int
) -> tuple[str, str]:
    """A non-streamed greedy completion: (its text, the model that answered)."""
    body = {"model": model, "prompt": list(prompt), "max_tokens": tokens, "temperature": 0.0}
    async with session.post(f"{base_url}/v1/completions", json=body) as response:
        data = await response.json()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {data}")
    return str(data["choices"][0]["text"]), str(data["model"])
