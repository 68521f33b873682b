"""An engine for tests that keep a request in flight for as long as they need."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loraserve.inference.engine import AdapterHandle, DeltaSink, EngineDelta, SamplingSpec
from loraserve.testing.inference.app import SharedEngine
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM


class HoldingEngine(SharedEngine):
    """The session's engine, able to hold the requests of one adapter revision (or the
    base model's: "") before they enter it, until let go: a test then keeps a request in
    flight, admitted and leasing its revision, for as long as it needs, whatever the speed
    of a loaded machine. Holding before the engine, not after a first message: vLLM merges
    the deltas a lagging reader has not taken, so under load a stream's first message may
    already be its last, and the whole generation runs after what the test does meanwhile."""

    def __init__(self, llm: AsyncLLM, add_calls: list[str]) -> None:
        super().__init__(llm, add_calls)
        # The vLLM LoRA name ("name@revision", "" the base model) held; None: none is.
        self.held_lora_name: str | None = None
        self.release = asyncio.Event()
        # Revisions held each until let go one by one (`hold_each`, `let_go_of`).
        self._each: dict[str, asyncio.Event] = {}
        # Requests held now.
        self.held = 0

    def hold(self, lora_name: str) -> None:
        """Holds every request of `lora_name` from now until `let_go`."""
        self.held_lora_name, self.release = lora_name, asyncio.Event()

    def let_go(self) -> None:
        """Lets the held requests into the engine and holds no more."""
        self.held_lora_name = None
        self.release.set()

    def hold_each(self, *lora_names: str) -> None:
        """Holds every request of each of `lora_names` until `let_go_of` it."""
        for lora_name in lora_names:
            self._each[lora_name] = asyncio.Event()

    def let_go_of(self, lora_name: str) -> None:
        """Lets the held requests of `lora_name` (held by `hold_each`) in, and holds no
        more of it."""
        self._each.pop(lora_name).set()

    def let_go_of_each(self) -> None:
        """Lets go of every revision `hold_each` still holds."""
        for lora_name in list(self._each):
            self.let_go_of(lora_name)

    async def until_held(self, count: int, *calls: asyncio.Future[Any]) -> None:
        """Returns once `count` requests are held; fails with the error of any of `calls`
        that ends before (or says it ended unheld), and after a guard if none does."""

        def held() -> bool:
            for call in calls:
                if call.done():
                    call.result()
                    raise AssertionError("a call ended before the engine held it")
            return self.held >= count

        await eventually(held, f"{count} request(s) held")

    async def _held(self, adapter: AdapterHandle | None) -> None:
        """Waits while requests of `adapter` are held."""
        lora_name = adapter.lora_name if adapter is not None else ""
        release = self.release if lora_name == self.held_lora_name else self._each.get(lora_name)
        if release is not None:
            self.held += 1
            try:
                await release.wait()
            finally:
                self.held -= 1

    async def push(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        sink: DeltaSink,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> None:
        await self._held(adapter)
        await super().push(
            request_id, prompt_token_ids, sampling, adapter, sink, trace_headers=trace_headers
        )

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        await self._held(adapter)
        deltas = super().generate(
            request_id, prompt_token_ids, sampling, adapter, trace_headers=trace_headers
        )
        async with contextlib.aclosing(deltas):
            async for delta in deltas:
                yield delta
