"""Every sampling option answers as vLLM does: gRPC, HTTP and vLLM's AsyncLLM agree.

For each option, one adapter and one prompt (token ids) run through the gRPC
service, the OpenAI completions and chat endpoints, and vLLM's `AsyncLLM` called
directly with the same `SamplingParams`: token ids, text and finish reason of every
choice (and logprobs where asked) must be equal. Where an option changes the answer,
the test also checks vLLM's answer without it differs, so agreeing proves the option
was applied, not ignored.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.engine.parity import (
    ADAPTER,
    EOS_TEXT,
    LONG,
    PROMPT,
    SEEDED,
    Fronts,
    direct,
    openai_body,
    scored_logprob,
    through_chat,
    through_completions,
    through_grpc,
)

pytestmark = pytest.mark.engine


@dataclass(frozen=True)
class Case:
    """Options as vLLM names them (gRPC and OpenAI use the same names), from the greedy
    tokens and the decoder; `reference`: the options without the one under test, whose
    answer must differ (None: the option does not change tokens or text)."""

    options: Callable[[list[int], Callable[[list[int]], str]], dict[str, Any]]
    reference: Callable[[list[int], Callable[[list[int]], str]], dict[str, Any]] | None = (
        lambda greedy, decode: {}
    )


CASES = {
    "greedy": Case(lambda g, d: {}, None),
    "seed": Case(lambda g, d: SEEDED),
    "top_k": Case(lambda g, d: SEEDED | {"top_k": 2}, lambda g, d: SEEDED),
    "top_p": Case(lambda g, d: SEEDED | {"top_p": 0.3}, lambda g, d: SEEDED),
    "min_p": Case(lambda g, d: SEEDED | {"min_p": 0.5}, lambda g, d: SEEDED),
    # Penalties act on repeated tokens: long enough for the greedy answer to repeat.
    "presence_penalty": Case(lambda g, d: LONG | {"presence_penalty": 2.0}, lambda g, d: LONG),
    "frequency_penalty": Case(lambda g, d: LONG | {"frequency_penalty": 2.0}, lambda g, d: LONG),
    "repetition_penalty": Case(lambda g, d: LONG | {"repetition_penalty": 2.0}, lambda g, d: LONG),
    "stop_token_ids": Case(lambda g, d: {"stop_token_ids": [g[3]]}),
    "min_tokens": Case(
        lambda g, d: {"stop_token_ids": [g[1]], "min_tokens": 4},
        lambda g, d: {"stop_token_ids": [g[1]]},
    ),
    "stop": Case(lambda g, d: {"stop": [d(g[2:4])]}),
    "include_stop_str_in_output": Case(
        lambda g, d: {"stop": [d(g[2:4])], "include_stop_str_in_output": True},
        lambda g, d: {"stop": [d(g[2:4])]},
    ),
    "ignore_eos": Case(lambda g, d: {"ignore_eos": True}, None),
    "logit_bias": Case(lambda g, d: {"logit_bias": {77: 100.0}}),
    "bad_words": Case(lambda g, d: {"bad_words": [d(g[:1]).strip()]}),
    "skip_special_tokens": Case(
        lambda g, d: EOS_TEXT | {"skip_special_tokens": False}, lambda g, d: EOS_TEXT
    ),
    # vLLM's detokenizer for fast tokenizers (the tiny model's) does not use it: equal only.
    "spaces_between_special_tokens": Case(
        lambda g, d: (
            EOS_TEXT | {"skip_special_tokens": False, "spaces_between_special_tokens": False}
        ),
        None,
    ),
    "n": Case(lambda g, d: SEEDED | {"n": 3}, lambda g, d: SEEDED),
    "logprobs": Case(lambda g, d: {"logprobs": 2}, None),
    "structured_regex": Case(lambda g, d: {"structured": {"regex": "(ab)+c"}}),
    "structured_choice": Case(lambda g, d: {"structured": {"choice": ["yes", "no"]}}),
    "structured_json": Case(
        lambda g, d: {
            "structured": {"json": {"type": "object", "properties": {"a": {"type": "integer"}}}}
        }
    ),
    "structured_grammar": Case(lambda g, d: {"structured": {"grammar": 'root ::= "x" | "yz"'}}),
}


@pytest.mark.parametrize("option", list(CASES))
async def test_option_answers_as_vllm_on_grpc_and_http(
    parity_fronts: Fronts, parity_greedy_tokens: list[int], option: str
) -> None:
    case = CASES[option]
    options = case.options(parity_greedy_tokens, parity_fronts.engine.decode)
    expected = await direct(parity_fronts, PROMPT, options)
    if case.reference is not None:
        reference = await direct(
            parity_fronts, PROMPT, case.reference(parity_greedy_tokens, parity_fronts.engine.decode)
        )
        assert expected != reference, f"{option} changes nothing here: pick a stronger value"

    assert await through_grpc(parity_fronts, options) == expected
    assert await through_completions(parity_fronts, options) == expected
    assert await direct(parity_fronts, parity_fronts.chat_prompt, options) == await through_chat(
        parity_fronts, options
    )


async def test_prompt_logprobs_answer_as_vllm_on_grpc_and_http(parity_fronts: Fronts) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    async for output in parity_fronts.llm.generate(
        TokensPrompt(prompt_token_ids=PROMPT),
        params,
        uuid.uuid4().hex,
        lora_request=parity_fronts.lora,
    ):
        final = output
    assert final.prompt_logprobs is not None
    expected: list[float | None] = [None]
    expected += [
        scored_logprob(lp, t) for t, lp in zip(PROMPT[1:], final.prompt_logprobs[1:], strict=True)
    ]

    request = pb.GenerateRequest(
        adapter=ADAPTER,
        token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
    )
    messages = [m async for m in parity_fronts.stub.Generate(request)]
    scored = [p.token.logprob if p.HasField("token") else None for p in messages[0].prompt_logprobs]
    assert scored == expected

    response = await parity_fronts.http.post(
        "/v1/completions",
        json=openai_body({"max_tokens": 1, "prompt_logprobs": 1}) | {"prompt": PROMPT},
    )
    rendered = response.json()["choices"][0]["prompt_logprobs"]
    assert [
        None if p is None else p[str(t)]["logprob"] for p, t in zip(rendered, PROMPT, strict=True)
    ] == expected


async def test_echo_with_logprobs_scores_the_prompt_then_the_completion(
    parity_fronts: Fronts,
) -> None:
    body = openai_body({"max_tokens": 2, "logprobs": 0}) | {"prompt": PROMPT, "echo": True}
    response = await parity_fronts.http.post("/v1/completions", json=body)
    choice = response.json()["choices"][0]
    greedy = await direct(parity_fronts, PROMPT, {"max_tokens": 2})
    assert choice["text"] == parity_fronts.engine.decode(PROMPT) + greedy[0].text
    logprobs = choice["logprobs"]["token_logprobs"]
    assert len(logprobs) == len(PROMPT) + 2
    assert logprobs[0] is None
    assert (
        tuple(logprobs[-2:])
        == (await direct(parity_fronts, PROMPT, {"max_tokens": 2, "logprobs": 0}))[0].logprobs
    )
