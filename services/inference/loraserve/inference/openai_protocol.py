"""The OpenAI request and response shapes, and their translation to and from Generate.

Only what Generate can honour is accepted: one choice (`n` = 1), no echo, no
logprobs, no penalties, no tools. A request that asks for more gets a 400 naming
the field, rather than a silently different answer. Fields this server does not
know are ignored, as OpenAI-compatible servers do. vLLM's extensions `top_k`,
`ignore_eos` and `return_token_ids` (the generated ids per choice) are honoured.

`model` is `""` or the served model's name (the base model), an adapter name (its
current revision) or `name@revision`. Responses name the revision that actually
served in `model`, the way OpenAI names the dated model behind an alias.

Chat without a chat template: models without one (the tiny test model, most base
models) get the messages as `<role>: <content>` lines followed by `assistant:`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from loraserve.common.errors import InvalidArgument, NotFound
from loraserve.common.names import parse_adapter_ref, shown, validate_adapter_name
from loraserve.inference.generation import (
    FinishReason,
    GenerateCommand,
    GenerationChunk,
    SamplingRequest,
)
from loraserve.inference.registry import AdapterState, RevisionStatus

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
OWNER = "loraserve"


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingFields(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="ignore")

    model: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions.
    top_k: int | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_supported(self) -> None:
        """Raises InvalidArgument for what Generate cannot honour."""
        if self.n not in (None, 1):
            raise InvalidArgument(f"n={self.n} is not supported: one choice per request")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise InvalidArgument(f"{name} is not supported; leave it unset or 0")
        if self.logit_bias:
            raise InvalidArgument("logit_bias is not supported")

    def sampling(self, max_tokens: int | None) -> SamplingRequest:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingRequest(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(stop),
            ignore_eos=self.ignore_eos,
        )


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.echo:
            raise InvalidArgument("echo is not supported")
        if self.logprobs is not None:
            raise InvalidArgument("logprobs is not supported")
        if self.best_of not in (None, 1):
            raise InvalidArgument(f"best_of={self.best_of} is not supported")
        if self.suffix:
            raise InvalidArgument("suffix is not supported")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[ContentPart] | None = None


class ChatRequest(_SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        if self.logprobs or self.top_logprobs:
            raise InvalidArgument("logprobs is not supported")
        if self.tools or self.functions or self.tool_choice not in (None, "none"):
            raise InvalidArgument("tools and functions are not supported")
        if self.response_format and self.response_format.get("type") != "text":
            raise InvalidArgument("response_format other than {'type': 'text'} is not supported")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise InvalidArgument("give max_tokens or max_completion_tokens, not both")


@runtime_checkable
class ChatTemplating(Protocol):
    """An engine that can apply its model's chat template."""

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int] | None:
        """The prompt for `messages` with the assistant's turn opened; None: no template."""
        ...


def adapter_for_model(model: str, base_names: Sequence[str]) -> str:
    """The Generate `adapter` that OpenAI's `model` names; the base model's name wins.

    A model that is no adapter name (another service's model, say) does not exist
    here (404); an adapter name with a malformed revision is a bad request (400).
    """
    if not model or model in base_names:
        return ""
    try:
        validate_adapter_name(model.partition("@")[0])
    except InvalidArgument as exc:
        raise NotFound(
            f"model {shown(model)} does not exist: serving {base_names[0]!r} and its adapters "
            f"(name or name@revision; see /v1/models)"
        ) from exc
    parse_adapter_ref(model)
    return model


def completion_command(
    request: CompletionRequest, adapter: str, request_id: str
) -> GenerateCommand:
    request.check_supported()
    prompt: Any = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        if len(prompt) != 1:
            raise InvalidArgument(f"prompt has {len(prompt)} prompts; send one prompt per request")
        prompt = prompt[0]
    text = prompt if isinstance(prompt, str) else None
    return GenerateCommand(
        adapter=adapter,
        prompt_text=text,
        prompt_token_ids=None if text is not None else tuple(prompt),
        sampling=request.sampling(request.max_tokens),
        request_id=request_id,
    )


def chat_messages(request: ChatRequest) -> list[dict[str, str]]:
    """The messages as plain role/content pairs; raises InvalidArgument for what is not text."""
    request.check_supported()
    if not request.messages:
        raise InvalidArgument("messages is empty: give at least one message")
    messages = []
    for i, message in enumerate(request.messages):
        if message.role not in CHAT_ROLES:
            raise InvalidArgument(
                f"messages[{i}].role {message.role!r} is not supported; "
                f"use one of {sorted(CHAT_ROLES)}"
            )
        messages.append({"role": message.role, "content": _text(message.content, i)})
    return messages


def _text(content: str | list[ContentPart] | None, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise InvalidArgument(
                f"messages[{index}] has a {part.type!r} content part; only text is supported"
            )
        texts.append(part.text)
    return "\n".join(texts)


def fallback_chat_prompt(messages: Sequence[Mapping[str, str]]) -> str:
    """The documented prompt for models without a chat template."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def chat_command(
    request: ChatRequest,
    adapter: str,
    request_id: str,
    *,
    prompt_text: str | None = None,
    prompt_token_ids: Sequence[int] | None = None,
) -> GenerateCommand:
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    return GenerateCommand(
        adapter=adapter,
        prompt_text=prompt_text,
        prompt_token_ids=tuple(prompt_token_ids) if prompt_token_ids is not None else None,
        sampling=request.sampling(max_tokens),
        request_id=request_id,
    )


def served_model(chunk: GenerationChunk, base_name: str) -> str:
    """What served the request, from its first chunk: `name@revision` or the base model."""
    return f"{chunk.adapter_name}@{chunk.revision}" if chunk.adapter_name else base_name


@dataclass
class Reply:
    """One request's answer as it streams; renders OpenAI chunks and the final response."""

    chat: bool
    first: GenerationChunk
    model: str
    token_ids: bool
    created: int = field(default_factory=lambda: int(time.time()))
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    usage: dict[str, int] | None = None

    @property
    def id(self) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{self.first.request_id}"

    def add(self, chunk: GenerationChunk) -> None:
        self.text.append(chunk.text)
        self.ids.extend(chunk.token_ids)
        if chunk.finish_reason is not None:
            self.finish = chunk.finish_reason
        if chunk.usage is not None:
            prompt, completion = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
            self.usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }

    def response(self) -> dict[str, Any]:
        """The non-streamed response, once every chunk was added."""
        text = "".join(self.text)
        finish = self.finish.value if self.finish else None
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if self.chat
            else {"index": 0, "text": text}
        )
        choice |= {"logprobs": None, "finish_reason": finish}
        if self.token_ids:
            choice["token_ids"] = self.ids
        return self._envelope("chat.completion" if self.chat else "text_completion") | {
            "choices": [choice],
            "usage": self.usage,
        }

    def role_chunk(self) -> dict[str, Any]:
        """Chat streams open with the assistant's role, as OpenAI's do."""
        delta = {"role": "assistant", "content": ""}
        return self._chunk({"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})

    def chunk(self, chunk: GenerationChunk) -> dict[str, Any] | None:
        """The stream event for `chunk`; None when it carries nothing to send."""
        if not (chunk.text or chunk.finish_reason or (self.token_ids and chunk.token_ids)):
            return None
        finish = chunk.finish_reason.value if chunk.finish_reason else None
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"content": chunk.text} if chunk.text else {}}
            if self.chat
            else {"index": 0, "text": chunk.text}
        )
        choice |= {"logprobs": None, "finish_reason": finish}
        if self.token_ids:
            choice["token_ids"] = list(chunk.token_ids)
        return self._chunk(choice)

    def usage_chunk(self) -> dict[str, Any]:
        """With `stream_options.include_usage`: the last event, no choices, the usage."""
        return self._chunk(None) | {"usage": self.usage}

    def _chunk(self, choice: dict[str, Any] | None) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return self._envelope(kind) | {"choices": [choice] if choice else []}

    def _envelope(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def model_list(base_name: str, statuses: Sequence[RevisionStatus], created: int) -> dict[str, Any]:
    """/v1/models: the base model, each routed adapter name, each loaded `name@revision`."""

    def entry(model_id: str, parent: str | None, root: str) -> dict[str, Any]:
        return {
            "id": model_id,
            "object": "model",
            "created": created,
            "owned_by": OWNER,
            "root": root,
            "parent": parent,
        }

    data = [entry(base_name, None, base_name)]
    # Draining revisions are on their way out; listing them would invite new requests.
    serving = [s for s in statuses if s.state is AdapterState.READY]
    for status in serving:
        if status.current:
            data.append(entry(status.name, base_name, f"{status.name}@{status.revision}"))
    for status in serving:
        ref = f"{status.name}@{status.revision}"
        data.append(entry(ref, base_name, ref))
    return {"object": "list", "data": data}


ErrorType = Literal[
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "conflict_error",
    "rate_limit_error",
    "timeout_error",
    "service_unavailable_error",
    "internal_error",
]


def error_body(message: str, error_type: ErrorType, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
