"""Where generation meets its limits, answered as vLLM does on gRPC and HTTP: several
prompts, stop tokens, the context's end, max_tokens left unset, values the engine
refuses, and streamed choices that must add up to the whole answer."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest

from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.testing.engine.parity import (
    ADAPTER,
    PROMPT,
    SEEDED,
    Fronts,
    direct,
    openai_body,
    through_completions,
    through_grpc,
)
from loraserve.testing.engine.session import MAX_MODEL_LEN

pytestmark = pytest.mark.engine


async def test_several_prompts_answer_each_as_vllm(
    parity_fronts: Fronts, parity_greedy_tokens: list[int]
) -> None:
    other = [1, 300, 17, 88]
    body = openai_body({}) | {"prompt": [PROMPT, other]}
    response = await parity_fronts.http.post("/v1/completions", json=body)
    choices = response.json()["choices"]
    assert [tuple(c["token_ids"]) for c in choices] == [
        (await direct(parity_fronts, PROMPT, {}))[0].token_ids,
        (await direct(parity_fronts, other, {}))[0].token_ids,
    ]


async def test_stop_token_ids_end_the_issue_example_early(
    parity_fronts: Fronts, parity_greedy_tokens: list[int]
) -> None:
    """The issue's example: stop_token_ids stopped vLLM early and was ignored here."""
    stop = parity_greedy_tokens[3]
    body = openai_body({"max_tokens": 24, "stop_token_ids": [stop]}) | {"prompt": PROMPT}
    completion = (await parity_fronts.http.post("/v1/completions", json=body)).json()["choices"][0]
    assert completion["finish_reason"] == "stop"
    assert completion["token_ids"][-1] == stop
    assert len(completion["token_ids"]) < 24
    answer = await through_grpc(parity_fronts, {"max_tokens": 24, "stop_token_ids": [stop]})
    assert answer[0].token_ids == tuple(completion["token_ids"])


async def test_a_prompt_that_nearly_fills_the_context_gets_the_tokens_that_fit(
    parity_fronts: Fronts,
) -> None:
    prompt = [1] + [40] * (MAX_MODEL_LEN - 4)
    body = openai_body({"max_tokens": 16, "ignore_eos": True}) | {"prompt": prompt}
    response = await parity_fronts.http.post("/v1/completions", json=body)
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert (len(choice["token_ids"]), choice["finish_reason"]) == (3, "length")
    request = pb.GenerateRequest(
        adapter=ADAPTER,
        token_ids=pb.TokenIds(ids=prompt),
        sampling=pb.SamplingParams(max_tokens=16, ignore_eos=True),
    )
    messages = [m async for m in parity_fronts.stub.Generate(request)]
    assert messages[-1].usage.completion_tokens == 3
    assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH


async def test_without_max_tokens_grpc_runs_to_the_context_end(parity_fronts: Fronts) -> None:
    prompt = [1] + [40] * (MAX_MODEL_LEN - 25)
    request = pb.GenerateRequest(
        adapter=ADAPTER,
        token_ids=pb.TokenIds(ids=prompt),
        sampling=pb.SamplingParams(ignore_eos=True, temperature=0.0),
    )
    messages = [m async for m in parity_fronts.stub.Generate(request)]
    assert messages[-1].usage.completion_tokens == MAX_MODEL_LEN - len(prompt)


async def test_without_max_tokens_completions_stop_at_16_as_vllm_serve(
    parity_fronts: Fronts,
) -> None:
    prompt = [1] + [40] * (MAX_MODEL_LEN - 25)
    for unset in ({}, {"max_tokens": None}):
        body = {"model": ADAPTER, "prompt": prompt, "ignore_eos": True} | unset
        usage = (await parity_fronts.http.post("/v1/completions", json=body)).json()["usage"]
        assert usage["completion_tokens"] == 16


async def test_chat_without_max_tokens_does_not_stop_at_16(parity_fronts: Fronts) -> None:
    content = "a" * (MAX_MODEL_LEN - 60)
    body = {
        "model": ADAPTER,
        "messages": [{"role": "user", "content": content}],
        "ignore_eos": True,
        "temperature": 0.0,
    }
    answer = (await parity_fronts.http.post("/v1/chat/completions", json=body)).json()
    assert answer["usage"]["total_tokens"] == MAX_MODEL_LEN
    assert answer["usage"]["completion_tokens"] > 16


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"min_p": 2.0}, "min_p"),
        ({"presence_penalty": 3.0}, "presence_penalty"),
        ({"frequency_penalty": -3.0}, "frequency_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"n": 0}, "n"),
        ({"top_k": -5}, "top_k"),
        ({"max_tokens": 4, "min_tokens": 9}, "min_tokens"),
        ({"logprobs": 1000}, "logprobs"),
        ({"logit_bias": {10_000_000: 1.0}}, "logit_bias"),
        ({"stop_token_ids": [10_000_000]}, "stop_token_ids"),
        ({"structured": {"regex": "("}}, "structured_output"),
        ({"structured": {"json": "not a schema"}}, "structured_output"),
    ],
)
async def test_values_the_engine_refuses_are_invalid_naming_the_field(
    parity_fronts: Fronts, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await through_grpc(parity_fronts, options)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (caught.value.details() or "")
    response = await parity_fronts.http.post(
        "/v1/completions", json=openai_body(options) | {"prompt": PROMPT}
    )
    assert response.status_code == 400
    assert field in response.json()["error"]["message"]


async def test_a_prompt_longer_than_the_context_is_invalid_naming_the_prompt(
    parity_fronts: Fronts,
) -> None:
    prompt = [1] + [40] * MAX_MODEL_LEN
    response = await parity_fronts.http.post(
        "/v1/completions", json=openai_body({}) | {"prompt": prompt}
    )
    assert response.status_code == 400
    assert "prompt" in response.json()["error"]["message"]


async def test_streamed_choices_and_logprobs_equal_the_whole_answer(parity_fronts: Fronts) -> None:
    options = SEEDED | {"n": 3, "logprobs": 1}
    expected = await through_completions(parity_fronts, options)
    body = openai_body(options) | {"prompt": PROMPT, "stream": True}
    ids: dict[int, list[int]] = {}
    logprobs: dict[int, list[float]] = {}
    async with parity_fronts.http.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                ids.setdefault(choice["index"], []).extend(choice["token_ids"])
                if choice["logprobs"]:
                    logprobs.setdefault(choice["index"], []).extend(
                        choice["logprobs"]["token_logprobs"]
                    )
    assert {i: tuple(t) for i, t in ids.items()} == {i: c.token_ids for i, c in expected.items()}
    assert {i: tuple(lp) for i, lp in logprobs.items()} == {
        i: c.logprobs for i, c in expected.items()
    }
