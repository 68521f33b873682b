"""`python -m bench.rig.raw_engine --control-fd FD [--lora NAME=DIR ...] VLLM_FLAGS...`: vLLM's
`AsyncLLM` used directly, in its own process, built from vLLM's own flags (the same ones
`vllm serve` gets), with the adapters loaded up front, served through bench.load.thin (the
thinnest path from a load generator in another process). None of loraserve runs here:
this is the engine alone, the limit any server in front of it can reach.

Like bench.rig.engine_host it writes {"ready": true, "thin": {"raw": PORT}} on FD once
ready, and serves until its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import IO, Any

import uvloop

from bench.load import thin
from bench.load.workload import Caller


def greedy_params(max_tokens: int) -> Any:
    """vLLM's SamplingParams for a benchmark request: greedy, ignore_eos, deltas."""
    from vllm.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )


def _caller(llm: Any, loras: dict[str, Any]) -> Caller:
    async def call(
        adapter: str, prompt: Sequence[int], max_tokens: int
    ) -> AsyncIterator[tuple[int, int]]:
        async for output in llm.generate(
            {"prompt_token_ids": list(prompt)},
            greedy_params(max_tokens),
            uuid.uuid4().hex,
            lora_request=loras.get(adapter),
        ):
            yield len(output.outputs[0].token_ids), 0

    return call


def _reply(control: IO[str], message: dict[str, Any]) -> None:
    control.write(json.dumps(message) + "\n")
    control.flush()


async def _serve(loras: list[str], flags: list[str], control: IO[str]) -> None:
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

    from bench.rig.vllm_args import parse_vllm_flags

    llm = AsyncLLM.from_engine_args(parse_vllm_flags(flags))
    try:
        requests: dict[str, Any] = {}
        for lora_id, item in enumerate(loras, start=1):
            name, _, path = item.partition("=")
            requests[name] = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path)
            await llm.add_lora(requests[name])
        server, port = await thin.serve(_caller(llm, requests))
        _reply(control, {"ready": True, "thin": {"raw": port}})
        while await asyncio.to_thread(sys.stdin.readline):
            pass
        server.close()
    finally:
        llm.shutdown()
        # Dropped while the interpreter still runs: AsyncLLM.__del__ shuts down again,
        # which fails noisily once module globals are gone at exit.
        del llm


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rig.raw_engine", allow_abbrev=False)
    parser.add_argument("--control-fd", type=int, required=True)
    parser.add_argument("--lora", action="append", default=[], help="NAME=DIR, loaded up front")
    args, flags = parser.parse_known_args()
    with open(args.control_fd, "w") as control:
        # The event loop `vllm serve` runs on (uvloop), as the service's own host does.
        uvloop.run(_serve(args.lora, flags, control))


# vLLM starts its engine process with `spawn`, which re-imports this module.
if __name__ == "__main__":
    main()
