"""The OpenAI-compatible front's completions and models on a fake engine, over real HTTP.

The real engine's answers through this front are tested in tests/test_openai_front.py.
"""

from __future__ import annotations

import pytest

from loraserve.testing.fakes.engine import FAKE_INFO
from loraserve.testing.inference.openai_front import CHAT, MODEL, StartFront, _post


async def test_completion_returns_text_usage_and_the_served_revision(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with front.client() as client:
        completion = await client.completions.create(model="alpha", prompt="hi", max_tokens=3)
    assert completion.choices[0].text == "<0><1><2>"
    assert completion.choices[0].finish_reason == "length"
    assert completion.model == "alpha@3"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (3, 3)


async def test_models_lists_the_base_model_the_adapter_and_its_revision(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with front.client() as client:
        models = [model.id async for model in client.models.list()]
    assert models == [MODEL, "alpha", "alpha@3"]


async def test_n_choices_come_with_their_indexes(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        completion = await client.completions.create(model="alpha", prompt="hi", max_tokens=2, n=2)
    assert [(c.index, c.text, c.finish_reason) for c in completion.choices] == [
        (0, "<0><1>", "length"),
        (1, "<0><1>", "length"),
    ]
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 4


async def test_several_prompts_get_choices_in_prompt_order(start_front: StartFront) -> None:
    front = await start_front()
    response = await _post(
        front,
        "/v1/completions",
        {"model": "alpha", "prompt": ["a", "bcd"], "max_tokens": 1, "n": 2},
    )
    body = response.json()
    assert response.status_code == 200
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    # Prompt tokens: "a" is 2 ids, "bcd" 4 (the fake adds a BOS); each prompt counts once.
    assert body["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}


async def test_echo_repeats_the_prompt_before_the_completion(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        completion = await client.completions.create(
            model="alpha", prompt="hi", max_tokens=1, echo=True
        )
    assert completion.choices[0].text == "hi<0>"


async def test_completion_logprobs_come_per_token(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        completion = await client.completions.create(
            model="alpha", prompt="hi", max_tokens=2, logprobs=1
        )
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["<0>", "<1>"]
    assert logprobs.token_logprobs == [0.0, -0.1]
    assert logprobs.top_logprobs == [{"<0>": 0.0}, {"<1>": -0.1}]
    assert logprobs.text_offset == [0, 3]
    assert front.engine.sampled[-1].logprobs == 1


@pytest.mark.parametrize(
    ("extra", "attribute", "expected"),
    [
        ({"stop_token_ids": [13]}, "stop_token_ids", [13]),
        ({"min_tokens": 1}, "min_tokens", 1),
        ({"repetition_penalty": 1.2}, "repetition_penalty", pytest.approx(1.2)),
        ({"min_p": 0.1}, "min_p", pytest.approx(0.1)),
        ({"include_stop_str_in_output": True}, "include_stop_str_in_output", True),
        ({"presence_penalty": 0.5}, "presence_penalty", 0.5),
        ({"frequency_penalty": 0.5}, "frequency_penalty", 0.5),
        ({"logit_bias": {"7": 5.0}}, "logit_bias", {7: 5.0}),
        ({"bad_words": ["fox"]}, "bad_words", ["fox"]),
        ({"skip_special_tokens": False}, "skip_special_tokens", False),
        ({"prompt_logprobs": 1}, "prompt_logprobs", 1),
    ],
)
async def test_sampling_options_reach_the_engine(
    start_front: StartFront, extra: dict[str, object], attribute: str, expected: object
) -> None:
    front = await start_front()
    body = {"model": "alpha", "prompt": "hi", "max_tokens": 1} | extra
    for path, request in (
        ("/v1/completions", body),
        ("/v1/chat/completions", {k: v for k, v in body.items() if k != "prompt"} | CHAT),
    ):
        response = await _post(front, path, request)
        assert response.status_code == 200, response.text
        assert getattr(front.engine.sampled[-1], attribute) == expected


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "json",
        ),
        ({"structured_outputs": {"regex": "[ab]"}}, "regex"),
        ({"structured_outputs": {"choice": ["a", "b"]}}, "choice"),
        ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "grammar"),
        ({"structured_outputs": {"json": {"type": "object"}}}, "json"),
    ],
)
async def test_structured_output_reaches_the_engine(
    start_front: StartFront, extra: dict[str, object], field: str
) -> None:
    front = await start_front()
    body = {"model": "alpha", "max_tokens": 1} | CHAT | extra
    response = await _post(front, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    assert getattr(front.engine.sampled[-1].structured_outputs, field) is not None


async def test_max_tokens_beyond_the_context_gets_what_fits(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        completion = await client.completions.create(model="alpha", prompt="hi", max_tokens=1000)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == FAKE_INFO.max_model_len - 3
    assert completion.choices[0].finish_reason == "length"
