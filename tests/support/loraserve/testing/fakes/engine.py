"""An in-memory `Engine` and `RevisionCache` for fast unit tests of inference logic.

Only for logic tests (registry state machine, generation rules); the end-to-end
tests run the real vLLM engine.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from safetensors.numpy import save

from loraserve.common.errors import FailedPrecondition, NotFound
from loraserve.common.revisions.manifest import FileInfo, Revision
from loraserve.inference.cache import CachedRevision, CacheUsage, Holder
from loraserve.inference.engine import (
    AdapterHandle,
    EngineDelta,
    EngineFinish,
    EngineInfo,
    EngineStats,
    PositionLogprobs,
    SamplingSpec,
    TokenLogprob,
)
from loraserve.inference.engine.sampling import (
    SamplingRequest,
    ServerDefaults,
    resolve_max_tokens,
    vllm_sampling_params,
)
from loraserve.testing.adapters.files import lora_config, lora_tensors
from loraserve.testing.engine.session import plain_chat_prompt

FAKE_INFO = EngineInfo(
    model="/models/fake-llama",
    version="0.0-fake",
    device="cpu",
    max_model_len=64,
    vocab_size=100,
    max_loras=2,
    max_lora_rank=16,
    max_cpu_loras=4,
    dtype="float32",
    lora_dtype="float32",
    gpu_memory_utilization=0.9,
    max_num_seqs=8,
)


class FakeEngine:
    """Generates token i at step i (in each of `n` choices); records adapters, aborts,
    what is running and the vLLM SamplingParams each request got (real vLLM mapping)."""

    def __init__(self, info: EngineInfo = FAKE_INFO) -> None:
        self._ids = itertools.count(1)
        self._info = info
        self.loaded: dict[int, AdapterHandle] = {}
        self.add_calls: list[AdapterHandle] = []
        self.removed: list[int] = []
        self.aborted: list[str] = []
        self.running: dict[str, AdapterHandle | None] = {}
        self.reject: set[str] = set()  # lora_names add_lora refuses
        # Cleared, add_lora waits for it; so does each generation step for `steps`.
        self.adding = asyncio.Event()
        self.adding.set()
        self.steps = asyncio.Event()
        self.steps.set()
        # Cleared, remove_lora waits for it (as a real engine's IPC takes a while).
        self.removing = asyncio.Event()
        self.removing.set()
        self.finish_with: EngineFinish = EngineFinish.LENGTH
        self.defaults = ServerDefaults()
        self.sampled: list[Any] = []
        self.chat_template = True

    @property
    def info(self) -> EngineInfo:
        return self._info

    def new_lora_id(self) -> int:
        return next(self._ids)

    def tokenize(self, text: str) -> list[int]:
        return [1, *(ord(c) % self._info.vocab_size for c in text)]

    async def prompt_ids(self, text: str) -> list[int]:
        return self.tokenize(text)

    async def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int] | None:
        """The prompt `PLAIN_CHAT_TEMPLATE` would render; None (as for a model without a
        template) when `chat_template` is False."""
        if not self.chat_template:
            return None
        return self.tokenize(plain_chat_prompt([dict(m) for m in messages]))

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(f"<{i}>" for i in token_ids)

    def sampling(self, request: SamplingRequest, prompt_tokens: int) -> SamplingSpec:
        max_tokens = resolve_max_tokens(
            request.max_tokens, prompt_tokens, self._info.max_model_len, self.defaults
        )
        params = vllm_sampling_params(request, max_tokens, self.defaults)
        self.sampled.append(params)
        return SamplingSpec(max_tokens=max_tokens, n=params.n, params=params)

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        self.running[request_id] = adapter
        finished = False
        try:
            logprobs = sampling.params.logprobs if sampling.params is not None else None
            for i in range(sampling.max_tokens):
                await self.steps.wait()
                # A real engine's outputs arrive from another process: each step gives
                # the loop a turn, as they do.
                await asyncio.sleep(0)
                last = i == sampling.max_tokens - 1
                for index in range(sampling.n):
                    finished = last and index == sampling.n - 1
                    yield EngineDelta(
                        text=f"<{i}>",
                        token_ids=(i,),
                        finish=self.finish_with if last else None,
                        index=index,
                        logprobs=(_fake_logprobs(i, logprobs),) if logprobs is not None else (),
                    )
        finally:
            del self.running[request_id]
            if not finished:
                self.aborted.append(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def add_lora(self, adapter: AdapterHandle) -> None:
        self.add_calls.append(adapter)
        await self.adding.wait()
        if adapter.lora_name in self.reject:
            raise FailedPrecondition(f"fake engine rejects {adapter.lora_name}")
        if adapter.lora_int_id in self.loaded:
            raise AssertionError(f"lora_int_id {adapter.lora_int_id} loaded twice")
        self.loaded[adapter.lora_int_id] = adapter

    async def remove_lora(self, lora_int_id: int) -> None:
        await self.removing.wait()
        self.loaded.pop(lora_int_id, None)
        self.removed.append(lora_int_id)

    async def list_loras(self) -> set[int]:
        return set(self.loaded)

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.running), waiting=0, kv_cache_usage=0.0)


def _fake_logprobs(token_id: int, top_k: int) -> PositionLogprobs:
    """Token i has logprob -i/10 and rank 1; the rest of the top are i+1, i+2, ..."""
    top = tuple(
        TokenLogprob(token_id + k, -(token_id + k) / 10, k + 1, f"<{token_id + k}>")
        for k in range(top_k)
    )
    return PositionLogprobs(TokenLogprob(token_id, -token_id / 10, 1, f"<{token_id}>"), top)


def make_revision(
    cache_dir: Path,
    name: str,
    revision: int,
    *,
    rank: int = 8,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    base_model: str = "fake-llama",
) -> CachedRevision:
    """A revision directory in `cache_dir`, as the cache lays it out, holding a small
    valid adapter of that rank and those modules (the replica reads its files before
    the engine gets it)."""
    path = cache_dir / name / str(revision)
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_bytes(lora_config(rank, target_modules))
    (path / "adapter_model.safetensors").write_bytes(save(lora_tensors(rank, target_modules)))
    return CachedRevision(fake_manifest(name, revision, rank, target_modules, base_model), path)


def fake_manifest(
    name: str,
    revision: int,
    rank: int = 8,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    base_model: str = "fake-llama",
) -> Revision:
    """A manifest with one placeholder file, for revisions no store holds."""
    return Revision(
        adapter_name=name,
        revision=revision,
        files=(FileInfo("adapter_config.json", 2, "0" * 64),),
        base_model=base_model,
        rank=rank,
        alpha=16.0,
        target_modules=target_modules,
        create_time=datetime(2026, 1, 1, tzinfo=UTC),
        pushed_by="test",
        description="",
        seq=0,
    )


class CacheDirectory:
    """The registry's cache (`RevisionCache`) over revision directories laid out as the
    cache lays them out, `<cache_dir>/<name>/<revision>/`: a revision whose directory
    exists is served from it; any other is `download`ed. Files stay unless a subclass
    deletes them in `remove`."""

    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self.removed: list[tuple[str, int]] = []

    @property
    def root(self) -> Path:
        return self.cache_dir

    async def fetch(
        self,
        name: str,
        revision: int,
        manifest: Revision | None = None,
        *,
        holder: Holder | None = None,
    ) -> CachedRevision:
        path = self.cache_dir / name / str(revision)
        if manifest is not None and path.is_dir():
            return CachedRevision(manifest, path)
        return await self.download(name, revision, manifest)

    async def download(self, name: str, revision: int, manifest: Revision | None) -> CachedRevision:
        raise NotFound(f"adapter {name}@{revision} is not on this disk")

    async def remove(self, name: str, revision: int) -> None:
        self.removed.append((name, revision))

    async def remove_unused(self, name: str, in_use: Callable[[str, int], bool]) -> None:
        adapter_dir = self.cache_dir / name
        revisions = [int(p.name) for p in adapter_dir.iterdir()] if adapter_dir.is_dir() else []
        for revision in revisions:
            if not in_use(name, revision):
                await self.remove(name, revision)

    def touch(self, name: str, revision: int) -> None:
        pass

    def hold_ended(self) -> None:
        pass

    def is_cached(self, name: str, revision: int) -> bool:
        return (self.cache_dir / name / str(revision)).is_dir()

    def usage(self) -> CacheUsage:
        return CacheUsage(0, None, 0, 0, 0)


class FakeFetcher(CacheDirectory):
    """A cache: downloads revisions listed in `available` into `cache_dir`, removes
    them again; counts both."""

    def __init__(self, cache_dir: Path) -> None:
        super().__init__(cache_dir)
        self.available: dict[tuple[str, int], int] = {}  # (name, revision) -> rank
        self.fetches: list[tuple[str, int]] = []
        # Cleared, downloads wait for it.
        self.gate = asyncio.Event()
        self.gate.set()

    def publish(self, name: str, revision: int, rank: int = 8) -> None:
        self.available[(name, revision)] = rank

    async def download(self, name: str, revision: int, manifest: Revision | None) -> CachedRevision:
        self.fetches.append((name, revision))
        await asyncio.sleep(0)
        await self.gate.wait()
        if (name, revision) not in self.available:
            raise NotFound(f"adapter {name}@{revision} does not exist")
        rank = self.available[(name, revision)]
        return make_revision(self.cache_dir, name, revision, rank=rank)

    async def remove(self, name: str, revision: int) -> None:
        await super().remove(name, revision)
        shutil.rmtree(self.cache_dir / name / str(revision), ignore_errors=True)
