"""OpenAI responses and stream events, built from Generate chunks.

One request may run several Generate streams (one per prompt); each stream may
carry `n` choices. Choice `i` of prompt `p` is OpenAI's choice `p * n + i`, as in
vLLM's server. Usage sums the streams.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loraserve.inference.engine import PositionLogprobs, TokenLogprob
from loraserve.inference.serving import FinishReason, GenerationChunk

# vLLM's chat logprobs floor: -inf is not JSON.
_CHAT_LOGPROB_FLOOR = -9999.0


def served_model(chunk: GenerationChunk, base_name: str) -> str:
    """What served the request, from its first chunk: `name@revision` or the base model."""
    return f"{chunk.adapter_name}@{chunk.revision}" if chunk.adapter_name else base_name


@dataclass(frozen=True)
class Echo:
    """A prompt to repeat before its choices' text (completions' `echo`)."""

    text: str
    first_token_text: str


@dataclass
class _Choice:
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    first_token_text: str | None = None
    offset: int = 0


@dataclass
class Reply:
    """One request's answer as it streams; renders OpenAI chunks and the final response."""

    chat: bool
    first: GenerationChunk
    model: str
    token_ids: bool
    n: int = 1
    logprobs: bool = False
    echo: Sequence[Echo] = ()
    created: int = field(default_factory=lambda: int(time.time()))
    choices: dict[int, _Choice] = field(default_factory=dict)
    usages: dict[int, tuple[int, int]] = field(default_factory=dict)
    # The prompt's scores reach only its stream's first chunk; with echo every choice of
    # the prompt repeats them, as vLLM's server does.
    prompt_scores: dict[int, list[PositionLogprobs]] = field(default_factory=dict)
    _envelopes: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.first.request_id}"

    @property
    def usage(self) -> dict[str, int] | None:
        if not self.usages:
            return None
        prompt = sum(p for p, _ in self.usages.values())
        completion = sum(c for _, c in self.usages.values())
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def add(self, stream: int, chunk: GenerationChunk) -> tuple[int, str, list[PositionLogprobs]]:
        """Records `chunk` of prompt `stream`; its choice index, text and logprobs as sent."""
        index = stream * self.n + chunk.index
        choice = self.choices.get(index)
        text, logprobs = chunk.text, list(chunk.logprobs)
        if choice is None:
            choice = self.choices[index] = _Choice()
            if self.echo:
                echo = self.echo[stream]
                text = echo.text + text
                choice.first_token_text = echo.first_token_text
        if chunk.prompt_logprobs:
            self.prompt_scores[stream] = list(chunk.prompt_logprobs)
        if self.echo and not choice.text:
            logprobs = self.prompt_scores.get(stream, []) + logprobs
        choice.text.append(text)
        choice.ids.extend(chunk.token_ids)
        choice.logprobs.extend(logprobs)
        if chunk.finish_reason is not None:
            choice.finish = chunk.finish_reason
        if chunk.usage is not None:
            self.usages[stream] = (chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        return index, text, logprobs

    def response(self) -> dict[str, Any]:
        """The non-streamed response, once every chunk was added."""
        choices = []
        for index in sorted(self.choices):
            choice = self.choices[index]
            text = "".join(choice.text)
            body: dict[str, Any] = (
                {"index": index, "message": {"role": "assistant", "content": text}}
                if self.chat
                else {"index": index, "text": text}
            )
            logprobs = self._logprobs(choice, choice.logprobs, reset=True)
            body |= {"logprobs": logprobs, "finish_reason": _finish(choice.finish)}
            if self.token_ids:
                body["token_ids"] = choice.ids
            if not self.chat and self.prompt_scores:
                body["prompt_logprobs"] = _prompt_logprobs(self.prompt_scores[index // self.n])
            choices.append(body)
        response = self._envelope("chat.completion" if self.chat else "text_completion") | {
            "choices": choices,
            "usage": self.usage,
        }
        if self.chat and self.prompt_scores:
            response["prompt_logprobs"] = _prompt_logprobs(self.prompt_scores[0])
        return response

    def role_chunks(self, indexes: Sequence[int]) -> list[dict[str, Any]]:
        """Chat streams open each choice with the assistant's role, as OpenAI's do."""
        delta = {"role": "assistant", "content": ""}
        return [
            self._chunk({"index": i, "delta": delta, "logprobs": None, "finish_reason": None})
            for i in indexes
        ]

    def chunk(self, stream: int, chunk: GenerationChunk) -> dict[str, Any] | None:
        """Records `chunk` and returns its stream event; None when it carries nothing."""
        index, text, logprobs = self.add(stream, chunk)
        if not (text or chunk.finish_reason or logprobs or (self.token_ids and chunk.token_ids)):
            return None
        choice: dict[str, Any] = (
            {"index": index, "delta": {"content": text} if text else {}}
            if self.chat
            else {"index": index, "text": text}
        )
        rendered = self._logprobs(self.choices[index], logprobs, reset=False)
        choice |= {"logprobs": rendered, "finish_reason": _finish(chunk.finish_reason)}
        if self.token_ids:
            choice["token_ids"] = list(chunk.token_ids)
        return self._chunk(choice)

    def usage_chunk(self) -> dict[str, Any]:
        """With `stream_options.include_usage`: the last event, no choices, the usage."""
        return self._chunk(None) | {"usage": self.usage}

    def _logprobs(
        self, choice: _Choice, positions: Sequence[PositionLogprobs], *, reset: bool
    ) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            return {"content": [_chat_logprob(p) for p in positions if p.token is not None]}
        offset = 0 if reset else choice.offset
        tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
        for position in positions:
            token = position.token
            text = token.text if token is not None else (choice.first_token_text or "")
            tokens.append(text)
            token_logprobs.append(token.logprob if token is not None else None)
            top_logprobs.append(_top(position) if token is not None else None)
            offsets.append(offset)
            offset += len(text)
        if not reset:
            choice.offset = offset
        return {
            "text_offset": offsets,
            "token_logprobs": token_logprobs,
            "tokens": tokens,
            "top_logprobs": top_logprobs,
        }

    def _chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._envelope(kind) | {"choices": [choice] if choice else []}

    def _envelope(self, kind: str) -> dict[str, Any]:
        # Built once per kind: every chunk of a stream repeats it.
        envelope = self._envelopes.get(kind)
        if envelope is None:
            envelope = {"id": self.id, "object": kind, "created": self.created, "model": self.model}
            self._envelopes[kind] = envelope
        return envelope


def _finish(reason: FinishReason | None) -> str | None:
    return reason.value if reason else None


def _top(position: PositionLogprobs) -> dict[str, float]:
    """Completions' top_logprobs: the top tokens and the sampled one, by text."""
    top = {t.text: t.logprob for t in position.top}
    if position.token is not None:
        top.setdefault(position.token.text, position.token.logprob)
    return top


def _prompt_logprobs(positions: Sequence[PositionLogprobs]) -> list[dict[str, Any] | None]:
    """vLLM's `prompt_logprobs`: per position, the scored tokens by id (None: unscored)."""
    rendered: list[dict[str, Any] | None] = []
    for position in positions:
        if position.token is None:
            rendered.append(None)
            continue
        scored = {t.token_id: t for t in (position.token, *position.top)}
        rendered.append(
            {
                str(t.token_id): {"logprob": t.logprob, "rank": t.rank, "decoded_token": t.text}
                for t in scored.values()
            }
        )
    return rendered


def _chat_logprob(position: PositionLogprobs) -> dict[str, Any]:
    assert position.token is not None
    return _chat_token(position.token) | {"top_logprobs": [_chat_token(t) for t in position.top]}


def _chat_token(token: TokenLogprob) -> dict[str, Any]:
    return {
        "token": token.text,
        "logprob": max(token.logprob, _CHAT_LOGPROB_FLOOR),
        "bytes": list(token.text.encode("utf-8")),
    }
