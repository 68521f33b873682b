"""Adapters read off the engine's step loop (issue 24, item 4), on the session's vLLM
engine: every load the server makes is served from the worker's preload, a preload
that fails leaves vLLM's own load (and its error) in place, and what a preloaded
adapter generates is what vLLM's own load of the same files generates."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loraserve.common.errors import FailedPrecondition
from loraserve.inference.engine import AdapterHandle, VllmEngine
from loraserve.testing.adapters.models import TinyAdapterFactory

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PROMPT = [1, 40, 41, 42, 43, 44, 45]


def _handle(engine: VllmEngine, name: str, path: Path) -> AdapterHandle:
    return AdapterHandle(lora_name=name, lora_int_id=engine.new_lora_id(), path=str(path))


async def _greedy(llm: AsyncLLM, handle: AdapterHandle, request_id: str) -> list[int]:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    lora = LoRARequest(handle.lora_name, handle.lora_int_id, handle.path)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=1)
    tokens: list[int] = []
    async for output in llm.generate(
        {"prompt_token_ids": PROMPT}, params, request_id=request_id, lora_request=lora
    ):
        tokens = list(output.outputs[0].token_ids)
    return tokens


async def test_an_adapter_the_server_adds_is_read_off_the_step_loop(
    vllm_engine: AsyncLLM, tiny_adapter: TinyAdapterFactory
) -> None:
    engine = VllmEngine(vllm_engine)
    before = await engine.preload_counts()
    handle = _handle(engine, "preloaded", tiny_adapter(seed=301))
    await engine.add_lora(handle)
    try:
        after = await engine.preload_counts()
    finally:
        await engine.remove_lora(handle.lora_int_id)
    assert after["preloaded"] == before["preloaded"] + 1
    assert after["on_step_loop"] == before["on_step_loop"]


async def test_a_preloaded_adapter_generates_what_vllms_own_load_generates(
    vllm_engine: AsyncLLM, tiny_adapter: TinyAdapterFactory, tmp_path: Path
) -> None:
    engine = VllmEngine(vllm_engine)
    # alpha 3 x rank: the scale (3.0) that the preload folds into lora_B.
    files = tiny_adapter(rank=8, seed=302, alpha=24)
    preloaded = _handle(engine, "via-preload", files)
    start = await engine.preload_counts()
    await engine.add_lora(preloaded)
    after_preload = await engine.preload_counts()
    # The same files under another path and id, loaded by vLLM itself when a request
    # names an adapter it has not loaded.
    copy = tmp_path / "copy"
    shutil.copytree(files, copy)
    by_vllm = _handle(engine, "via-vllm", copy)
    try:
        ours = await _greedy(vllm_engine, preloaded, "preload-parity-ours")
        after_ours = await engine.preload_counts()
        theirs = await _greedy(vllm_engine, by_vllm, "preload-parity-theirs")
        after_theirs = await engine.preload_counts()
    finally:
        await engine.remove_lora(preloaded.lora_int_id)
        await engine.remove_lora(by_vllm.lora_int_id)
    # Parity says nothing unless each side took its own path: one load served from
    # the preload, and (generating with it loading nothing more) one load that vLLM
    # made on its step loop for the request naming the copy.
    assert after_preload == {
        "preloaded": start["preloaded"] + 1,
        "on_step_loop": start["on_step_loop"],
    }
    assert after_ours == after_preload
    assert after_theirs == {
        "preloaded": after_preload["preloaded"],
        "on_step_loop": after_preload["on_step_loop"] + 1,
    }
    assert len(ours) == 8
    assert ours == theirs


async def test_an_adapter_whose_preload_fails_is_refused_by_vllms_own_load(
    vllm_engine: AsyncLLM, tiny_adapter: TinyAdapterFactory, tmp_path: Path
) -> None:
    engine = VllmEngine(vllm_engine)
    broken = tmp_path / "broken"
    shutil.copytree(tiny_adapter(seed=303), broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    before = await engine.preload_counts()
    with pytest.raises(FailedPrecondition, match="could not load adapter broken"):
        await engine.add_lora(_handle(engine, "broken", broken))
    after = await engine.preload_counts()
    assert after["on_step_loop"] == before["on_step_loop"] + 1
    assert after["preloaded"] == before["preloaded"]
