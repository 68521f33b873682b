"""Log-probabilities as the engine reports them, in plain types both fronts render."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability at a position, and its rank among all tokens."""

    token_id: int
    logprob: float
    rank: int | None
    text: str


@dataclass(frozen=True)
class PositionLogprobs:
    """The token at one position (None where the engine scores none) and the top ones."""

    token: TokenLogprob | None
    top: tuple[TokenLogprob, ...] = ()


def vllm_logprobs(
    token_ids: Sequence[int], logprobs: Any, top_k: int | None
) -> tuple[PositionLogprobs, ...]:
    """vLLM's per-position logprobs (dicts of token id to Logprob, or None) in our types.

    vLLM sends the chosen token with the `top_k` best; the chosen one is among those
    only when it ranks there.
    """
    positions = []
    for token_id, candidates in zip(token_ids, logprobs, strict=False):
        if candidates is None:
            positions.append(PositionLogprobs(None))
            continue
        scored = [
            TokenLogprob(tid, float(lp.logprob), lp.rank, lp.decoded_token or "")
            for tid, lp in candidates.items()
        ]
        chosen = next((c for c in scored if c.token_id == token_id), None)
        top = tuple(sorted(scored, key=lambda c: c.rank or 0)[: top_k or 0])
        positions.append(PositionLogprobs(chosen, top))
    return tuple(positions)
