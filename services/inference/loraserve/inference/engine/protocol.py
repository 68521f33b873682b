"""The seam to the inference engine: what the service needs of an engine with LoRA
support, in plain types, so everything above it can be unit-tested with a fake engine.
`VllmEngine` is the one implementation."""

from __future__ import annotations

import enum
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loraserve.inference.engine.logprobs import PositionLogprobs
from loraserve.inference.engine.sampling import SamplingRequest


@dataclass(frozen=True)
class AdapterHandle:
    """One adapter revision as the engine knows it (vLLM's LoRARequest, minus vLLM)."""

    lora_name: str
    lora_int_id: int
    path: str


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling ready for the engine: the choices and tokens it will produce, and the
    engine's own parameters (vLLM's SamplingParams for `VllmEngine`)."""

    max_tokens: int
    n: int = 1
    params: Any = None


class EngineFinish(enum.Enum):
    """Why the engine ended a request."""

    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


# Not frozen: one is made per streamed token, and a frozen dataclass's per-field
# object.__setattr__ made that cost several times more. Nothing mutates one.
@dataclass(slots=True)
class EngineDelta:
    """What one engine step added to a request."""

    text: str
    token_ids: tuple[int, ...]
    finish: EngineFinish | None = None
    # Which of the request's `n` choices this delta extends.
    index: int = 0
    # One entry per token in `token_ids`, when logprobs were asked for.
    logprobs: tuple[PositionLogprobs, ...] = ()
    # Every prompt position, on the request's first delta, when prompt_logprobs were asked for.
    prompt_logprobs: tuple[PositionLogprobs, ...] = ()


@dataclass(frozen=True)
class EngineStats:
    """Load on the engine now."""

    running: int
    waiting: int
    kv_cache_usage: float
    # Engine LoRA names (`AdapterHandle.lora_name`) with running (waiting) requests.
    running_adapters: frozenset[str] = frozenset()
    waiting_adapters: frozenset[str] = frozenset()


@dataclass(frozen=True)
class EngineInfo:
    """How the engine was configured, as it reports it."""

    model: str
    version: str
    device: str
    max_model_len: int
    vocab_size: int
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    dtype: str
    lora_dtype: str
    gpu_memory_utilization: float
    # Most requests the scheduler runs in one batch (vLLM's max_num_seqs).
    max_num_seqs: int


class Engine(Protocol):
    """What the service needs from an inference engine with LoRA support."""

    @property
    def info(self) -> EngineInfo: ...

    def new_lora_id(self) -> int:
        """A lora_int_id never handed out before on this engine."""
        ...

    async def prompt_ids(self, text: str) -> list[int]:
        """The prompt token ids the engine would feed the model for `text`; raises
        InvalidArgument for a prompt longer than the context, without tokenizing more of
        it than the context holds."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of `token_ids`, as the engine detokenizes them."""
        ...

    def sampling(self, request: SamplingRequest, prompt_tokens: int) -> SamplingSpec:
        """The engine's sampling for a prompt this long; raises InvalidArgument naming
        the field the engine rejects."""
        ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
        *,
        trace_headers: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[EngineDelta, None]:
        """Streams deltas; closing the iterator early aborts the request in the engine.
        `trace_headers`: the request's span (W3C `traceparent`), for an engine that traces
        its own steps to put its spans under it; None for an untraced request."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def add_lora(self, adapter: AdapterHandle) -> None:
        """Loads an adapter; raises FailedPrecondition if the engine rejects it."""
        ...

    async def remove_lora(self, lora_int_id: int) -> None: ...

    async def list_loras(self) -> set[int]: ...

    def stats(self) -> EngineStats: ...
