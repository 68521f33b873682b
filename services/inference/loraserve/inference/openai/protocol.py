"""The translation of OpenAI requests to Generate commands, and of state to replies.

Every sampling option vLLM's OpenAI server takes for text generation is accepted
and mapped onto the one `SamplingRequest` the gRPC front uses too; vLLM validates
it (loraserve.inference.engine.sampling). A field this server does not know or cannot
honour (tools, suffix, best_of above n, ...) is a 400 naming it, never silently
dropped: the request models forbid unknown fields. vLLM's extensions (`top_k`,
`min_p`, `repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`,
`bad_words`, `structured_outputs`, `prompt_logprobs`, `return_token_ids`, ...) are
honoured. `user` (an end user's id) picks the arm of an adapter's rollout when no
`x-rollout-key` header does, so one user sees one revision.
The request bodies themselves are `openai_requests`.

`model` is `""` or the served model's name (the base model), an adapter name (its
current revision) or `name@revision`. Responses name the revision that actually
served in `model`, the way OpenAI names the dated model behind an alias.

Chat needs the model's chat template, as in vLLM's server: a model whose tokenizer has
none (most base models) is refused with vLLM's message, not served with a made-up one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from loraserve.common.config.pins import PinPolicy
from loraserve.common.errors import InvalidArgument, NotFound
from loraserve.common.revisions.names import parse_adapter_ref, shown, validate_adapter_name
from loraserve.inference.adapters import RevisionLife, RevisionStatus
from loraserve.inference.openai.requests import ChatRequest, CompletionRequest, ContentPart
from loraserve.inference.serving import GenerateCommand

# vLLM's refusal for a model without a chat template (its server answers 400), and how
# to serve chat anyway.
NO_CHAT_TEMPLATE = (
    "As of transformers v4.44, default chat template is no longer allowed, so you must "
    "provide a chat template if the tokenizer does not define one. This model's tokenizer "
    "defines none: give it one (tokenizer_config.json's chat_template), or use "
    "/v1/completions"
)
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
OWNER = "loraserve"


@runtime_checkable
class ChatTemplating(Protocol):
    """An engine that can apply its model's chat template."""

    async def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int] | None:
        """The prompt for `messages` with the assistant's turn opened; None: no template.
        Raises InvalidArgument for a prompt longer than the context."""
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


def chat_command(
    request: ChatRequest,
    adapter: str,
    request_id: str,
    *,
    render_prompt: Callable[[], Awaitable[Sequence[int]]],
) -> GenerateCommand:
    """The chat as a command whose prompt (`render_prompt`, the chat template) is
    rendered only once the request is admitted."""
    max_tokens = (
        request.max_completion_tokens
        if request.max_completion_tokens is not None
        else request.max_tokens
    )
    return GenerateCommand(
        adapter=adapter,
        render_prompt=render_prompt,
        sampling=request.sampling(max_tokens, request.sampled_logprobs),
        request_id=request_id,
    )


def model_list(
    base_name: str, statuses: Sequence[RevisionStatus], pins: PinPolicy, created: int
) -> dict[str, Any]:
    """/v1/models: the base model, each routed adapter name (loaded or loaded on its
    first request), each loaded `name@revision` the pin policy `pins` serves."""

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
    serving = [s for s in statuses if s.state is RevisionLife.READY and _pinnable(s, pins)]
    routed = [s for s in statuses if s.state in (RevisionLife.READY, RevisionLife.AVAILABLE)]
    for status in routed:
        if status.current:
            data.append(entry(status.name, base_name, f"{status.name}@{status.revision}"))
    for status in serving:
        ref = f"{status.name}@{status.revision}"
        data.append(entry(ref, base_name, ref))
    return {"object": "list", "data": data}


def _pinnable(status: RevisionStatus, pins: PinPolicy) -> bool:
    if pins is PinPolicy.ROLLOUT:
        return status.current or status.candidate
    return pins is PinPolicy.ANY


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
