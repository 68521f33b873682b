"""The OpenAI-compatible front's HTTP rules on a fake engine, over real HTTP on 127.0.0.1.

The real engine's answers through this front are tested in tests/test_openai_front.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

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
from loraserve.testing.inference_fakes import FakeEngine, make_revision

MODEL = "fake-llama"
READER = "reader-secret"


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
        await _eventually(lambda: bool(engine.running))
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
    await _eventually(lambda: bool(engine.aborted))
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
        await _eventually(lambda: bool(engine.running))
        request.cancel()
        await asyncio.gather(request, return_exceptions=True)
    await _eventually(lambda: bool(engine.aborted))
    assert not engine.running


def test_addresses_split_into_host_and_port() -> None:
    assert split_address("0.0.0.0:8000") == ("0.0.0.0", 8000)
    assert split_address("[::1]:0") == ("::1", 0)


async def _eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if check():
                return
            await asyncio.sleep(0.01)
