"""What a Generate stream is made of: its chunks, how it finishes, and what a request
came to (for the per-revision counts of a rollout's arms)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from loraserve.inference.engine import EngineFinish, PositionLogprobs
from loraserve.inference.serving.quotas import no_charge


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"


# The engine's finishes a stream ends with (an abort ends it in error).
FINISH_REASONS = {EngineFinish.STOP: FinishReason.STOP, EngineFinish.LENGTH: FinishReason.LENGTH}


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


# Not frozen: one is made per streamed token, and a frozen dataclass's per-field
# object.__setattr__ made that cost several times more. Nothing mutates one.
@dataclass(slots=True)
class GenerationChunk:
    """One streamed message: the first names what serves it, the last how it ended."""

    text: str
    # A tuple pulled, vLLM's own list pushed (not copied: this is per token).
    token_ids: Sequence[int]
    adapter_name: str = ""
    revision: int = 0
    request_id: str = ""
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    # Which of the `n` choices the chunk extends; its finish_reason ends that choice.
    index: int = 0
    # One entry per token in `token_ids`, when logprobs were asked for.
    logprobs: tuple[PositionLogprobs, ...] = ()
    # Every prompt position, on the first chunk, when prompt_logprobs were asked for.
    prompt_logprobs: tuple[PositionLogprobs, ...] = ()
    # The prompt as the engine got it; on the first chunk.
    prompt_token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class Outcome:
    """What a request came to, for the per-revision counts of a rollout's arms."""

    revision: int = 0
    # Time to first token from admission: what the caller waited.
    ttft_s: float | None = None
    generated: int = 0
    # Charges generated tokens to the adapter's quota as they stream.
    charge: Callable[[int], None] = no_charge
    # time.monotonic() when it was admitted (0: never), when it went to the engine, and
    # when its first token came.
    admitted: float = 0.0
    submitted: float = 0.0
    first_token: float | None = None

    @property
    def engine_ttft_s(self) -> float | None:
        """Time to first token from the engine's submission: what the revision itself
        took, without the waits for admission, a turn or the adapter's load."""
        return None if self.first_token is None else self.first_token - self.submitted
