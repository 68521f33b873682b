"""An engine for tests that keep a request in flight for as long as they need."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import TYPE_CHECKING

from loraserve.inference.engine import AdapterHandle, EngineDelta, SamplingSpec
from loraserve.testing.inference.app import SharedEngine

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


class HoldingEngine(SharedEngine):
    """The session's engine, able to hold back the last delta of one adapter revision's
    requests (or the base model's: "") until released: a test then keeps a request in
    flight for as long as it needs, whatever the speed of a loaded machine."""

    def __init__(self, llm: AsyncLLM, add_calls: list[str]) -> None:
        super().__init__(llm, add_calls)
        # None: nothing is held.
        self.held_lora_name: str | None = None
        self.release = asyncio.Event()
        # Set once a delta is held: its request is then in flight until `release`, even
        # when the engine handed over all its tokens at once (vLLM merges the deltas of
        # a stream whose reader lags, so a first message may already be the last).
        self.holding = asyncio.Event()

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
    ) -> AsyncGenerator[EngineDelta, None]:
        held = (adapter.lora_name if adapter is not None else "") == self.held_lora_name
        deltas = super().generate(request_id, prompt_token_ids, sampling, adapter)
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                if held and delta.finish is not None:
                    self.holding.set()
                    await self.release.wait()
                yield delta
