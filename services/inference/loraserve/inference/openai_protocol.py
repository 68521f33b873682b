"""The OpenAI request shapes and their translation to Generate commands.

Every sampling option vLLM's OpenAI server takes for text generation is accepted
and mapped onto the one `SamplingRequest` the gRPC front uses too; vLLM validates
it (loraserve.inference.sampling). A field this server does not know or cannot
honour (tools, suffix, best_of above n, ...) is a 400 naming it, never silently
dropped: the request models forbid unknown fields. vLLM's extensions (`top_k`,
`min_p`, `repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`,
`bad_words`, `structured_outputs`, `prompt_logprobs`, `return_token_ids`, ...) are
honoured. `user` is accepted and not used, as OpenAI's own servers do for routing.

`model` is `""` or the served model's name (the base model), an adapter name (its
current revision) or `name@revision`. Responses name the revision that actually
served in `model`, the way OpenAI names the dated model behind an alias.

Chat without a chat template: models without one (the tiny test model, most base
models) get the messages as `<role>: <content>` lines followed by `assistant:`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from loraserve.common.errors import InvalidArgument, NotFound
from loraserve.common.names import parse_adapter_ref, shown, validate_adapter_name
from loraserve.inference.generation import GenerateCommand
from loraserve.inference.registry import AdapterState, RevisionStatus
from loraserve.inference.sampling import SamplingRequest, StructuredOutput

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
OWNER = "loraserve"


class _Strict(BaseModel):
    # Unknown fields are refused by name: a silently dropped option changes the answer.
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` extension; exactly one constraint."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def constraint(self) -> StructuredOutput:
        schema = self.json_ if not isinstance(self.json_, dict) else json.dumps(self.json_)
        choice = tuple(self.choice) if self.choice is not None else None
        return StructuredOutput(
            json=schema,
            regex=self.regex,
            choice=choice,
            grammar=self.grammar,
            json_object=self.json_object,
        )


class JsonSchema(BaseModel):
    # OpenAI's json_schema object; its own fields (name, description, strict) may grow.
    model_config = ConfigDict(extra="allow")

    name: str = ""
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None

    def constraint(self) -> StructuredOutput | None:
        if self.type == "json_object":
            return StructuredOutput(json_object=True)
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise InvalidArgument("response_format.json_schema.schema is required")
            return StructuredOutput(json=json.dumps(self.json_schema.schema_))
        return None


class _SamplingFields(_Strict):
    """The fields both endpoints share."""

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
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputs | None = None
    return_token_ids: bool = False

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def check_supported(self) -> None:
        """Raises InvalidArgument for what Generate cannot honour."""
        if self.stream_options is not None and self.stream_options.continuous_usage_stats:
            raise InvalidArgument("stream_options.continuous_usage_stats is not supported")
        if self.stream and self.prompt_logprobs is not None:
            # As vLLM's server: the prompt's scores go in the whole response only.
            raise InvalidArgument("prompt_logprobs is not available with stream=true")

    def sampling(self, max_tokens: int | None, logprobs: int | None) -> SamplingRequest:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingRequest(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(stop),
            ignore_eos=self.ignore_eos,
            n=self.n,
            min_p=self.min_p,
            min_tokens=self.min_tokens,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
            logit_bias=_logit_bias(self.logit_bias),
            bad_words=tuple(self.bad_words or ()),
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs,
            structured_output=self._structured_output(),
        )

    def _structured_output(self) -> StructuredOutput | None:
        from_format = self.response_format.constraint() if self.response_format else None
        if from_format is not None and self.structured_outputs is not None:
            raise InvalidArgument("give response_format or structured_outputs, not both")
        if self.structured_outputs is not None:
            return self.structured_outputs.constraint()
        return from_format


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    converted = {}
    for token, value in (bias or {}).items():
        try:
            converted[int(token)] = value
        except ValueError:
            raise InvalidArgument(
                f"logit_bias key {token!r} is not a token id (an integer)"
            ) from None
    return converted


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def check_supported(self) -> None:
        super().check_supported()
        # vLLM 0.32's SamplingParams has no best_of; best_of = n is the same request.
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise InvalidArgument(
                f"best_of={self.best_of} is not supported: vLLM dropped best_of; "
                "leave it unset or equal to n"
            )
        if self.suffix:
            raise InvalidArgument("suffix is not supported")

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts: one, or several sent as a list."""
        prompt: Any = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and isinstance(prompt[0], str | list):
            return list(prompt)
        return [list(prompt)]


class ContentPart(BaseModel):
    # Parts other than text are refused by type in chat_messages, with a clearer message.
    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(_Strict):
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

    def check_supported(self) -> None:
        super().check_supported()
        if self.tools or self.functions or self.tool_choice not in (None, "none"):
            raise InvalidArgument("tools and functions are not supported")
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise InvalidArgument("give max_tokens or max_completion_tokens, not both")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidArgument("top_logprobs needs logprobs=true")

    @property
    def sampled_logprobs(self) -> int | None:
        """As vLLM's chat: logprobs=true asks for the sampled token's and top_logprobs more."""
        return (self.top_logprobs or 0) if self.logprobs else None


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


def completion_commands(
    request: CompletionRequest, adapter: str, request_id: str
) -> list[GenerateCommand]:
    """One command per prompt; choice indexes follow prompt order, as vLLM's."""
    request.check_supported()
    prompts = request.prompts()
    if not prompts:
        raise InvalidArgument("prompt is empty: give a prompt")
    logprobs = request.logprobs
    # echo with logprobs scores the prompt too, as vLLM's server does.
    prompt_logprobs = request.prompt_logprobs
    if prompt_logprobs is None and request.echo:
        prompt_logprobs = logprobs
    sampling = request.sampling(request.max_tokens, logprobs)
    if prompt_logprobs != sampling.prompt_logprobs:
        sampling = dataclasses.replace(sampling, prompt_logprobs=prompt_logprobs)
    commands = []
    for i, prompt in enumerate(prompts):
        text = prompt if isinstance(prompt, str) else None
        commands.append(
            GenerateCommand(
                adapter=adapter,
                prompt_text=text,
                prompt_token_ids=tuple(prompt) if not isinstance(prompt, str) else None,
                sampling=sampling,
                request_id=request_id if len(prompts) == 1 else _nth(request_id, i),
            )
        )
    return commands


def _nth(request_id: str, index: int) -> str:
    return f"{request_id}-{index}" if request_id else ""


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
        sampling=request.sampling(max_tokens, request.sampled_logprobs),
        request_id=request_id,
    )


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
