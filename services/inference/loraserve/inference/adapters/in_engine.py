"""Putting one cached revision into the engine and taking it out again.

Only a path strictly inside the adapter cache directory is ever loaded, and only
after the compatibility checks pass; the files themselves belong to the cache. An adapter the engine
finishes adding after its caller was cancelled is removed again in the
background, so the engine never keeps an adapter nobody knows about.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path

from loraserve.common.errors import FailedPrecondition
from loraserve.common.tracing import child_span, tracer
from loraserve.inference.adapters.compat import AdapterFacts, CompatibilityChecker
from loraserve.inference.engine import AdapterHandle, Engine

_TRACER = tracer(__name__)


class EngineAdapters:
    def __init__(
        self,
        engine: Engine,
        cache_dir: Path,
        compat: CompatibilityChecker,
        spawn: Callable[[Awaitable[None]], object],
    ) -> None:
        self._engine = engine
        self._cache_dir = cache_dir.resolve()
        self._compat = compat
        # Runs background work the owner waits for when it settles.
        self._spawn = spawn

    def check_facts(self, facts: AdapterFacts) -> None:
        """Raises FailedPrecondition for an adapter the server cannot serve, judged
        from its manifest alone (before any byte is downloaded)."""
        self._compat.check(facts)

    async def check(self, facts: AdapterFacts, path: Path) -> None:
        """Raises FailedPrecondition for a path outside the cache or an adapter the
        server cannot serve: its manifest, then its files (tensor shapes, finite
        weights, the LoRA scale), read in a worker thread."""
        if not self._inside_cache(path):
            raise FailedPrecondition(
                f"adapter {facts.name}@{facts.revision}: refusing to load {path}, "
                f"which is not inside the adapter cache {self._cache_dir}"
            )
        with child_span(_TRACER, "loraserve.replica.verify") as span:
            if span.is_recording():
                span.set_attribute("loraserve.check", "values")
            self._compat.check(facts)
            await asyncio.to_thread(self._compat.check_weights, facts.name, facts.revision, path)

    def handle(self, name: str, revision: int, path: Path) -> AdapterHandle:
        """A new engine adapter for a revision, with an id never used before on the engine."""
        return AdapterHandle(
            lora_name=f"{name}@{revision}",
            lora_int_id=self._engine.new_lora_id(),
            path=str(path),
        )

    async def add(self, handle: AdapterHandle) -> None:
        # The engine may finish loading after the caller is cancelled; an adapter
        # nobody knows about would then stay in the engine, so remove it afterwards.
        adding = asyncio.ensure_future(self._engine.add_lora(handle))
        with child_span(_TRACER, "loraserve.replica.engine_load") as span:
            if span.is_recording():
                span.set_attribute("loraserve.lora_int_id", handle.lora_int_id)
            try:
                await asyncio.shield(adding)
            except asyncio.CancelledError:
                adding.add_done_callback(functools.partial(self._remove_orphan, handle))
                raise

    async def discard(self, added: AdapterHandle | None) -> None:
        """Undoes a load that will not be served: out of the engine, if it got there."""
        if added is not None:
            await self._engine.remove_lora(added.lora_int_id)

    async def remove(self, handle: AdapterHandle) -> None:
        """Takes a loaded revision out of the engine; vLLM may re-read its path until
        then, so its files go back to the cache only after this."""
        await self._engine.remove_lora(handle.lora_int_id)

    def _inside_cache(self, path: Path) -> bool:
        resolved = path.resolve()
        return resolved != self._cache_dir and resolved.is_relative_to(self._cache_dir)

    def _remove_orphan(self, handle: AdapterHandle, adding: asyncio.Future[None]) -> None:
        if adding.cancelled() or adding.exception() is not None:
            return
        self._spawn(self._engine.remove_lora(handle.lora_int_id))
