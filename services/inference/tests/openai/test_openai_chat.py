"""The OpenAI-compatible front's chat completions on a fake engine, over real HTTP.

The real engine's answers through this front are tested in tests/test_openai_front.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import openai
import pytest

from loraserve.inference.engine.sampling import ServerDefaults
from loraserve.testing.fakes.engine import FAKE_INFO, FakeEngine
from loraserve.testing.inference.openai_front import MESSAGES, MODEL, StartFront


class TemplatingEngine(FakeEngine):
    """A fake engine that records what its chat template got."""

    def __init__(self) -> None:
        super().__init__()
        self.templated: list[list[dict[str, str]]] = []

    async def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int] | None:
        self.templated.append([dict(m) for m in messages])
        return [1, 7, 7, 7]


async def test_chat_with_a_model_without_a_chat_template_is_a_bad_request(
    start_front: StartFront,
) -> None:
    engine = FakeEngine()
    engine.chat_template = False
    front = await start_front(engine)
    async with front.client() as client:
        with pytest.raises(openai.BadRequestError, match="no longer allowed") as refused:
            await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert "provide a chat template" in refused.value.message
    assert engine.sampled == []


async def test_chat_with_a_template_sends_the_templated_token_ids(
    start_front: StartFront,
) -> None:
    engine = TemplatingEngine()
    front = await start_front(engine)
    async with front.client() as client:
        chat = await client.chat.completions.create(
            model="alpha",
            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            max_tokens=1,
        )
    assert engine.templated == [[{"role": "user", "content": "hi"}]]
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == 4


async def test_chat_logprobs_come_per_token_with_top_logprobs(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        chat = await client.chat.completions.create(
            model="alpha",
            messages=MESSAGES,
            max_tokens=1,
            logprobs=True,
            top_logprobs=2,
        )
    logprobs = chat.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert [(t.token, t.logprob) for t in logprobs.content] == [("<0>", 0.0)]
    assert [t.token for t in logprobs.content[0].top_logprobs] == ["<0>", "<1>"]


async def test_chat_without_max_tokens_runs_to_the_end_of_the_context(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with front.client() as client:
        chat = await client.chat.completions.create(model="alpha", messages=MESSAGES)
    assert chat.usage is not None
    assert chat.usage.prompt_tokens + chat.usage.completion_tokens == FAKE_INFO.max_model_len
    assert chat.choices[0].finish_reason == "length"


async def test_chat_without_max_tokens_takes_the_models_default(
    start_front: StartFront,
) -> None:
    engine = FakeEngine()
    engine.defaults = ServerDefaults({"max_tokens": 5, "temperature": 0.25})
    front = await start_front(engine)
    async with front.client() as client:
        chat = await client.chat.completions.create(model="alpha", messages=MESSAGES)
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 5
    assert engine.sampled[-1].temperature == 0.25
