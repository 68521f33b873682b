"""Sampling options as either front (gRPC, OpenAI) receives them, mapped onto vLLM's own.

Both fronts translate their request into one `SamplingRequest`; this module is the
only place that turns it into vLLM's `SamplingParams`. vLLM's constructor decides
what is valid, so its rules cannot drift from a copy here; its `ValueError` becomes
INVALID_ARGUMENT naming the field. Server defaults follow vLLM's OpenAI server:
the request's value, else the model's `generation_config.json`, else vLLM's neutral
value; `max_tokens` unset runs to the end of the context (vLLM's `get_max_tokens`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from loraserve.common.config.textlimits import SHOWN_ITEMS, few
from loraserve.common.errors import InvalidArgument

# loraserve's own abuse limits (vLLM has none): stop strings are matched on every step.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256

# Fields the model's generation_config.json may default, with vLLM's neutral values;
# as vLLM's CompletionRequest._DEFAULT_SAMPLING_PARAMS (a test checks they agree).
DEFAULTED_FIELDS: dict[str, float | int] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the output; exactly one field is set by a valid caller."""

    json: str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | None = None
    grammar: str | None = None
    json_object: bool | None = None


@dataclass(frozen=True)
class SamplingRequest:
    """Sampling as the client asked for it; None takes the server's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    n: int | None = None
    min_p: float | None = None
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    bad_words: tuple[str, ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured_output: StructuredOutput | None = None
    # At most one streamed message per this many tokens; the first is never delayed.
    stream_interval: int | None = None


def check_limits(sampling: SamplingRequest) -> None:
    """loraserve's own limits, which vLLM does not have; vLLM checks the rest."""
    # vLLM clamps each bias into [-100, 100], and NaN passes a clamp unchanged.
    not_numbers = [token for token, bias in sampling.logit_bias.items() if math.isnan(bias)]
    if not_numbers:
        raise InvalidArgument(
            f"sampling.logit_bias: the bias of {len(not_numbers)} token ids is NaN "
            f"({few(not_numbers)}); give numbers (vLLM clamps them to [-100, 100])"
        )
    if len(sampling.stop) > MAX_STOP_STRINGS:
        raise InvalidArgument(
            f"sampling.stop has {len(sampling.stop)} strings; at most {MAX_STOP_STRINGS} allowed"
        )
    for i, stop in enumerate(sampling.stop):
        if not stop or len(stop) > MAX_STOP_STRING_CHARS:
            raise InvalidArgument(
                f"sampling.stop[{i}] must have 1 to {MAX_STOP_STRING_CHARS} characters, "
                f"got {len(stop)}"
            )


@dataclass(frozen=True)
class ServerDefaults:
    """What vLLM's OpenAI server reads from the model config once at start-up."""

    sampling: Mapping[str, Any] = field(default_factory=dict)
    override_max_tokens: int | None = None

    @classmethod
    def of_model(cls, model_config: Any) -> ServerDefaults:
        """As vLLM's OpenAIServingCompletion/Chat compute them in their constructors."""
        defaults = model_config.get_diff_sampling_param()
        override = (
            defaults.get("max_tokens")
            if model_config.generation_config not in ("auto", "vllm")
            else getattr(model_config, "override_generation_config", {}).get("max_new_tokens")
        )
        return cls(dict(defaults), override)


def resolve_max_tokens(
    requested: int | None, prompt_tokens: int, max_model_len: int, defaults: ServerDefaults
) -> int:
    """vLLM's server rule: the request's (or default) max_tokens, capped by what fits."""
    from vllm.entrypoints.serve.utils.api_utils import get_max_tokens

    try:
        return int(
            get_max_tokens(
                max_model_len,
                requested,
                prompt_tokens,
                dict(defaults.sampling),
                defaults.override_max_tokens,
            )
        )
    except ValueError as exc:
        raise InvalidArgument(f"prompt: {exc}") from exc


def vllm_sampling_params(
    sampling: SamplingRequest, max_tokens: int, defaults: ServerDefaults
) -> Any:
    """vLLM's `SamplingParams` for the request (streamed as deltas); vLLM validates it."""
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    check_limits(sampling)
    values = {
        name: value
        if (value := getattr(sampling, name)) is not None
        else defaults.sampling.get(name, neutral)
        for name, neutral in DEFAULTED_FIELDS.items()
    }
    try:
        structured = (
            StructuredOutputsParams(
                json=sampling.structured_output.json,
                regex=sampling.structured_output.regex,
                choice=list(sampling.structured_output.choice)
                if sampling.structured_output.choice is not None
                else None,
                grammar=sampling.structured_output.grammar,
                json_object=sampling.structured_output.json_object,
            )
            if sampling.structured_output is not None
            else None
        )
    except (ValueError, VLLMValidationError) as exc:
        raise InvalidArgument(f"sampling.structured_output: {exc}") from exc
    chosen: dict[str, Any] = {
        "n": sampling.n,
        "seed": sampling.seed,
        "min_tokens": sampling.min_tokens,
        "logprobs": sampling.logprobs,
        "prompt_logprobs": sampling.prompt_logprobs,
        "skip_special_tokens": sampling.skip_special_tokens,
        "spaces_between_special_tokens": sampling.spaces_between_special_tokens,
        "logit_bias": dict(sampling.logit_bias) or None,
        "bad_words": list(sampling.bad_words) or None,
        "structured_outputs": structured,
        "stream_interval": sampling.stream_interval,
    }
    try:
        # from_optional, as vLLM's server: it also clamps logit_bias to [-100, 100].
        return SamplingParams.from_optional(
            **values,
            **{name: value for name, value in chosen.items() if value is not None},
            stop=list(sampling.stop),
            stop_token_ids=list(sampling.stop_token_ids),
            ignore_eos=sampling.ignore_eos,
            max_tokens=max_tokens,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            output_kind=RequestOutputKind.DELTA,
        )
    except VLLMValidationError as exc:
        field_name = f"sampling.{exc.parameter}" if exc.parameter else "sampling"
        raise InvalidArgument(f"{field_name}: {_vllm_message(exc, sampling)}") from exc
    except ValueError as exc:
        raise InvalidArgument(f"sampling: {_vllm_message(exc, sampling)}") from exc


def verify_for_model(params: Any, vllm_config: Any, tokenizer: Any) -> None:
    """vLLM's checks against the served model (vocabulary, max_logprobs, structured-output
    grammar), run now so that the error names the field; the engine repeats them."""
    from vllm.exceptions import VLLMValidationError

    try:
        params.verify(
            vllm_config.model_config,
            vllm_config.speculative_config,
            vllm_config.structured_outputs_config,
            tokenizer,
        )
    except VLLMValidationError as exc:
        if exc.parameter:
            # vLLM reports -1 ("the whole vocabulary") as the vocabulary's size.
            whole = getattr(params, exc.parameter, None) == -1
            note = f"{exc.parameter}=-1 asks for the whole vocabulary: " if whole else ""
            message = _vllm_message(exc, params)
            raise InvalidArgument(f"sampling.{exc.parameter}: {note}{message}") from exc
        raise InvalidArgument(f"{_suspect(params)}: {_vllm_message(exc, params)}") from exc
    except ValueError as exc:
        raise InvalidArgument(f"{_suspect(params)}: {_vllm_message(exc, params)}") from exc


def _vllm_message(exc: Exception, request: Any) -> str:
    """vLLM's message with each list it quotes whole (every out-of-vocabulary id, every
    bad word) cut to a few items and a count: a status message must stay small."""
    text = str(exc)
    quoted = (getattr(exc, "value", None), *(getattr(request, name, None) for name in _LISTS))
    for items in quoted:
        if isinstance(items, list | tuple) and len(items) > SHOWN_ITEMS:
            text = text.replace(str(list(items)), f"[{few(items)}]")
    return text


# The request's lists vLLM quotes in its messages.
_LISTS = ("bad_words", "stop", "stop_token_ids")


def _suspect(params: Any) -> str:
    # Without a parameter name, vLLM's model checks fail on a structured output's grammar.
    return "sampling.structured_output" if params.structured_outputs is not None else "sampling"
