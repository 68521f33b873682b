"""What one generation is, on the client's side: the sampling a caller asks for, the
deltas it streams back, the completion they add up to, and the `GenerateRequest`
built from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from loraserve.common.rpc.sampling_fields import OPTIONAL_SAMPLING_FIELDS
from loraserve.inference.v1 import inference_pb2 as pb

_FINISH_REASONS = {pb.FINISH_REASON_STOP: "stop", pb.FINISH_REASON_LENGTH: "length"}

__all__ = ["Completion", "Delta", "Sampling", "build_request", "delta_from"]


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters (vLLM's); None leaves the server's default. For what this
    does not name, pass a `pb.SamplingParams` wherever a Sampling is taken."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: Sequence[str] = ()
    ignore_eos: bool = False
    n: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: Sequence[int] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    bad_words: Sequence[str] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # At most one message per this many tokens (the first token is never held back).
    stream_interval: int | None = None
    # Output constraints; at most one: a JSON schema (as JSON text), a regex, choices.
    json_schema: str | None = None
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None

    def to_proto(self) -> pb.SamplingParams:
        params = pb.SamplingParams(
            stop=list(self.stop),
            ignore_eos=self.ignore_eos,
            stop_token_ids=list(self.stop_token_ids),
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=dict(self.logit_bias),
            bad_words=list(self.bad_words),
        )
        for name in OPTIONAL_SAMPLING_FIELDS:
            value = getattr(self, name)
            if value is not None:
                setattr(params, name, value)
        constraints = {
            "json_schema": self.json_schema,
            "regex": self.regex,
            "choice": pb.Choices(values=list(self.choice)) if self.choice is not None else None,
            "grammar": self.grammar,
        }
        given = {name: value for name, value in constraints.items() if value is not None}
        if given:
            # More than one is the server's to refuse, naming the field.
            for name, value in given.items():
                if isinstance(value, pb.Choices):
                    params.structured_output.choice.CopyFrom(value)
                else:
                    setattr(params.structured_output, name, value)
        return params


@dataclass(frozen=True)
class Delta:
    """One streamed piece of a generation (of choice `index`, when n > 1)."""

    text: str
    token_ids: tuple[int, ...]
    # Set on the first delta: what was actually served.
    adapter_name: str = ""
    revision: int = 0
    # Set on the last delta.
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    index: int = 0
    # With `logprobs`: per token, the sampled token's and the top ones.
    logprobs: tuple[pb.PositionLogprobs, ...] = ()
    # With `prompt_logprobs`, on the first delta: per prompt token.
    prompt_logprobs: tuple[pb.PositionLogprobs, ...] = ()


@dataclass
class Completion:
    """A whole generation, as `generate` returns it."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    adapter_name: str = ""
    revision: int = 0
    finish_reason: str | None = None
    # Request totals (all choices).
    prompt_tokens: int = 0
    completion_tokens: int = 0
    logprobs: list[pb.PositionLogprobs] = field(default_factory=list)
    prompt_logprobs: list[pb.PositionLogprobs] = field(default_factory=list)


_new = object.__new__
_set = object.__setattr__
_LAST_PLAIN_FIELD = max(
    pb.GenerateResponse.DESCRIPTOR.fields_by_name[name].number for name in ("text", "token_ids")
)


def delta_from(message: pb.GenerateResponse) -> Delta:
    fields = message.ListFields()  # set fields, in field-number order
    if not fields or fields[-1][0].number <= _LAST_PLAIN_FIELD:
        # The middle of a stream: text and token ids, every other field at its default.
        # Runs once per token; a frozen dataclass's __init__ would set all ten fields
        # through object.__setattr__, four times the cost of setting these two (the
        # rest read the class's defaults).
        delta = _new(Delta)
        _set(delta, "text", message.text)
        _set(delta, "token_ids", tuple(message.token_ids))
        return delta
    return Delta(
        text=message.text,
        token_ids=tuple(message.token_ids),
        adapter_name=message.adapter_name,
        revision=message.revision,
        finish_reason=_FINISH_REASONS.get(message.finish_reason),
        prompt_tokens=message.usage.prompt_tokens,
        completion_tokens=message.usage.completion_tokens,
        index=message.index,
        logprobs=tuple(message.logprobs),
        prompt_logprobs=tuple(message.prompt_logprobs),
    )


def build_request(
    adapter: str,
    prompt: str | Sequence[int],
    sampling: Sampling | pb.SamplingParams,
    request_id: str = "",
) -> pb.GenerateRequest:
    params = sampling.to_proto() if isinstance(sampling, Sampling) else sampling
    request = pb.GenerateRequest(adapter=adapter, sampling=params, request_id=request_id)
    if isinstance(prompt, str):
        request.text = prompt
    else:
        request.token_ids.ids.extend(prompt)
    return request
