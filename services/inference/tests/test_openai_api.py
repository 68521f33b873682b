"""The OpenAI-compatible front's HTTP rules on a fake engine, over real HTTP on 127.0.0.1.

The real engine's answers through this front are tested in tests/test_openai_front.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from loraserve.common.security import ServerSecurity, Token
from loraserve.inference.admission import Admission
from loraserve.inference.compat import LLAMA_TARGET_MODULES, CompatibilityChecker
from loraserve.inference.engine import AdapterHandle, EngineDelta, SamplingSpec
from loraserve.inference.generation import Generator
from loraserve.inference.http_server import RunningHttpServer, split_address, start_http_server
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.openai_api import create_openai_app
from loraserve.inference.openai_protocol import fallback_chat_prompt
from loraserve.inference.registry import AdapterRegistry
from loraserve.inference.runtime import Runtime, RuntimeSlot
from loraserve.inference.sampling import ServerDefaults
from loraserve.testing.inference_fakes import FAKE_INFO, FakeEngine, make_revision
from loraserve.testing.waiting import eventually

MODEL = "fake-llama"
READER = "reader-secret"
MESSAGES: list[Any] = [{"role": "user", "content": "hi"}]
CHAT: dict[str, object] = {"messages": MESSAGES}


class TemplatingEngine(FakeEngine):
    """A fake engine whose model has a chat template."""

    def __init__(self) -> None:
        super().__init__()
        self.templated: list[list[dict[str, str]]] = []

    def chat_prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int] | None:
        self.templated.append([dict(m) for m in messages])
        return [1, 7, 7, 7]


class StallingEngine(FakeEngine):
    """Sends one token, then never another: a stream that only a disconnect ends."""

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        adapter: AdapterHandle | None,
    ) -> AsyncGenerator[EngineDelta, None]:
        self.running[request_id] = adapter
        try:
            yield EngineDelta(text="<0>", token_ids=(0,))
            await asyncio.Event().wait()
        finally:
            del self.running[request_id]
            self.aborted.append(request_id)


@dataclass
class Front:
    engine: FakeEngine
    slot: RuntimeSlot
    server: RunningHttpServer
    url: str

    def client(self, api_key: str = "unused") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0)


StartFront = Callable[..., Awaitable[Front]]


@pytest.fixture
async def start_front(tmp_path: Path) -> AsyncIterator[StartFront]:
    servers: list[RunningHttpServer] = []

    async def start(
        engine: FakeEngine | None = None,
        security: ServerSecurity | None = None,
        runtime: bool = True,
        max_pending: int = 8,
    ) -> Front:
        engine = engine or FakeEngine()
        compat = CompatibilityChecker(
            max_lora_rank=16, target_modules=LLAMA_TARGET_MODULES, served_model_name=MODEL
        )
        registry = AdapterRegistry(engine, cache_dir=tmp_path, compat=compat)
        await registry.install(make_revision(tmp_path, "alpha", 3), make_current=True)
        admission = Admission(max_pending)
        slot = RuntimeSlot()
        if runtime:
            generator = Generator(engine, registry, admission, InferenceMetrics())
            slot.set(Runtime(engine, registry, generator, admission, replica_id="r"))
        app = create_openai_app(
            slot,
            model_names=[MODEL, f"/models/{MODEL}"],
            security=security or ServerSecurity(),
            is_ready=lambda: runtime,
        )
        server = await start_http_server(app, address="127.0.0.1:0", security=ServerSecurity())
        servers.append(server)
        return Front(engine, slot, server, f"http://127.0.0.1:{server.port}")

    yield start
    for server in servers:
        await server.stop(grace=None)


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


async def test_streamed_completion_sends_deltas_usage_and_done(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with httpx.AsyncClient(base_url=front.url) as http:
        response = await http.post(
            "/v1/completions",
            json={
                "model": MODEL,
                "prompt": [1, 2],
                "max_tokens": 2,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert '"text":"<0>"' in events[0]
    assert '"finish_reason":"length"' in events[1]
    assert '"choices":[]' in events[2]
    assert '"total_tokens":4' in events[2]


async def test_chat_without_a_template_uses_the_fallback_prompt(
    start_front: StartFront,
) -> None:
    front = await start_front()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    async with front.client() as client:
        chat = await client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=2,
        )
    prompt = fallback_chat_prompt(messages)
    assert prompt == "system: be brief\nuser: hi\nassistant:"
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == len(front.engine.tokenize(prompt))
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == "<0><1>"


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


async def test_streamed_chat_opens_with_the_assistant_role(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with front.client() as client:
        stream = await client.chat.completions.create(
            model="alpha",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "<0><1>"
    assert chunks[-1].choices[0].finish_reason == "length"
    assert {c.model for c in chunks} == {"alpha@3"}


async def test_models_lists_the_base_model_the_adapter_and_its_revision(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with front.client() as client:
        models = [model.id async for model in client.models.list()]
    assert models == [MODEL, "alpha", "alpha@3"]


async def test_unknown_adapter_is_not_found(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        with pytest.raises(openai.NotFoundError) as raised:
            await client.completions.create(model="nope", prompt="hi", stream=True)
    assert raised.value.code == "not_found"
    assert "nope" in raised.value.message


async def test_a_model_that_is_no_adapter_name_is_not_found(
    start_front: StartFront,
) -> None:
    front = await start_front()
    async with front.client() as client:
        with pytest.raises(openai.NotFoundError, match="see /v1/models"):
            await client.completions.create(model="org/Other-Model", prompt="hi")


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"temperature": 5}, "temperature"),
        ({"n": 0}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "tail"}, "suffix"),
        ({"max_tokens": "many"}, "max_tokens"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"logit_bias": {"x": 1.0}}, "logit_bias"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": -1}, "repetition_penalty"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_output"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"prompt": ""}, "prompt is empty"),
    ],
)
async def test_bad_parameter_is_a_400_naming_it(
    start_front: StartFront, extra: dict[str, object], named: str
) -> None:
    front = await start_front()
    async with httpx.AsyncClient(base_url=front.url) as http:
        response = await http.post(
            "/v1/completions", json={"model": "alpha", "prompt": "x"} | extra
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert named in error["message"]


async def test_chat_with_an_image_part_is_a_400(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        with pytest.raises(openai.BadRequestError, match="only text"):
            await client.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ],
            )


async def test_full_server_is_429_with_retry_after(start_front: StartFront) -> None:
    engine = FakeEngine()
    engine.steps.clear()
    front = await start_front(engine, max_pending=1)
    async with httpx.AsyncClient(base_url=front.url) as http:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        holding = asyncio.create_task(http.post("/v1/completions", json=body))
        await eventually(lambda: bool(engine.running), "a request running")
        response = await http.post("/v1/completions", json=body)
        engine.steps.set()
        assert (await holding).status_code == 200
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "rate_limit_error"


async def test_before_the_engine_is_up_requests_get_503_and_health_is_503(
    start_front: StartFront,
) -> None:
    front = await start_front(runtime=False)
    async with front.client() as client:
        with pytest.raises(openai.InternalServerError) as raised:
            await client.completions.create(model=MODEL, prompt="x")
    assert raised.value.status_code == 503
    async with httpx.AsyncClient(base_url=front.url) as http:
        assert (await http.get("/health")).status_code == 503


async def test_with_tokens_configured_a_request_without_one_is_401(
    start_front: StartFront,
) -> None:
    security = ServerSecurity(reader_tokens=(Token("reader", READER),))
    front = await start_front(security=security)
    async with front.client(api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    async with front.client(api_key=READER) as client:
        completion = await client.completions.create(model=MODEL, prompt="x", max_tokens=1)
    assert completion.choices[0].text == "<0>"


async def test_client_disconnect_mid_stream_aborts_the_engine_request(
    start_front: StartFront,
) -> None:
    engine = StallingEngine()
    front = await start_front(engine)
    async with front.client() as client:
        stream = await client.completions.create(
            model="alpha", prompt="x", max_tokens=4, stream=True
        )
        async for chunk in stream:
            assert chunk.choices[0].text == "<0>"
            break
        await stream.close()
    await eventually(lambda: bool(engine.aborted), "the request aborted")
    assert not engine.running


async def test_client_disconnect_before_a_non_streamed_answer_aborts_it(
    start_front: StartFront,
) -> None:
    engine = FakeEngine()
    engine.steps.clear()
    front = await start_front(engine)
    async with httpx.AsyncClient(base_url=front.url) as http:
        body = {"model": MODEL, "prompt": "x", "max_tokens": 2}
        request = asyncio.create_task(http.post("/v1/completions", json=body))
        await eventually(lambda: bool(engine.running), "a request running")
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
    await eventually(lambda: bool(engine.aborted), "the request aborted")
    assert not engine.running


def test_addresses_split_into_host_and_port() -> None:
    assert split_address("0.0.0.0:8000") == ("0.0.0.0", 8000)
    assert split_address("[::1]:0") == ("::1", 0)


async def _post(front: Front, path: str, body: dict[str, object]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=front.url) as http:
        return await http.post(path, json=body)


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


async def test_several_prompts_stream_every_choice(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        stream = await client.completions.create(
            model="alpha", prompt=["a", "b"], max_tokens=2, stream=True
        )
        chunks = [chunk async for chunk in stream]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {0: "<0><1>", 1: "<0><1>"}


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


async def test_max_tokens_beyond_the_context_gets_what_fits(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        completion = await client.completions.create(model="alpha", prompt="hi", max_tokens=1000)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == FAKE_INFO.max_model_len - 3
    assert completion.choices[0].finish_reason == "length"


@pytest.mark.parametrize(
    ("path", "extra", "named"),
    [
        ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "tools"),
        ("/v1/chat/completions", {"echo": True}, "echo"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"guided_json": {}}, "guided_json"),
        ("/v1/completions", {"prompt": "x" * 70}, "prompt"),
    ],
)
async def test_unsupported_option_is_a_400_naming_it(
    start_front: StartFront, path: str, extra: dict[str, object], named: str
) -> None:
    front = await start_front()
    body = {"model": "alpha"} | (CHAT if "chat" in path else {"prompt": "x"}) | extra
    response = await _post(front, path, body)
    assert response.status_code == 400
    assert named in response.json()["error"]["message"]


async def test_streamed_completion_carries_logprobs_per_chunk(start_front: StartFront) -> None:
    front = await start_front()
    async with front.client() as client:
        stream = await client.completions.create(
            model="alpha", prompt="hi", max_tokens=2, logprobs=0, stream=True
        )
        chunks = [chunk async for chunk in stream]
    logprobs = [c.choices[0].logprobs for c in chunks if c.choices]
    assert [(lp.tokens, lp.token_logprobs, lp.text_offset) for lp in logprobs if lp] == [
        (["<0>"], [0.0], [0]),
        (["<1>"], [-0.1], [3]),
    ]
