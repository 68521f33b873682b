"""The OpenAI request bodies this server accepts, as pydantic models.

A field the models do not know is refused by name (extra="forbid"): a silently
dropped option would change the answer. Each request checks what Generate cannot
honour (`check_supported`) and maps its sampling fields onto the one
`SamplingRequest` the gRPC front uses too, raising InvalidArgument naming the field.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loraserve.common.errors import InvalidArgument
from loraserve.inference.engine import SamplingRequest, StructuredOutput

# /v1/completions' max_tokens when the request has none.
COMPLETION_MAX_TOKENS = 16


class _Strict(BaseModel):
    # Unknown fields are refused by name: a silently dropped option changes the answer.
    model_config = ConfigDict(extra="forbid")


def _unicode_text(value: Any, where: str) -> None:
    """Raises ValueError naming the first string in `value` that is not Unicode text:
    JSON may escape a lone surrogate (`"\\ud800"`), which no tokenizer or grammar takes."""
    if isinstance(value, str):
        found = _LONE_SURROGATE.search(value)
        if found is not None:
            raise ValueError(
                f"{where} is not valid Unicode text: a lone surrogate "
                f"(U+{ord(found.group()):04X}) at character {found.start()}"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            _unicode_text(key, where)
            _unicode_text(item, f"{where}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _unicode_text(item, f"{where}[{i}]")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


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

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key, value in data.items():
                _unicode_text(value, str(key))
        return data

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
    # As OpenAI's API and vLLM's server: 16 tokens unless asked otherwise (chat has no
    # such default), also when the request sends null.
    max_tokens: int | None = COMPLETION_MAX_TOKENS
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_max_tokens_is_the_default(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("max_tokens", 0) is None:
            data = data | {"max_tokens": COMPLETION_MAX_TOKENS}
        return data

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
