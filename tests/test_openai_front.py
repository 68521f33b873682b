"""The OpenAI-compatible front on the real vLLM engine, driven by the `openai` package.

The same engine, registry and Generate logic as the gRPC service serve it; the
greedy tokens it returns for an adapter equal transformers + PEFT's (the oracle).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import openai
import pytest

from loraserve.inference.app import InferenceApp
from loraserve.inference.engine import VllmEngine
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.settings import EngineOptions, parse_settings
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.session import PLAIN_CHAT_TEMPLATE, chat_template, plain_chat_prompt
from loraserve.testing.engine.work import engine_work
from loraserve.testing.fakes.engine import CacheDirectory
from loraserve.testing.inference.service import (
    copy_revision,
    make_runtime_ref,
    openai_server,
    tiny_registry,
)
from loraserve.testing.store.server import RunningStore
from loraserve.testing.streams import running_stream
from loraserve.testing.waiting import eventually
from loraserve.tiny.oracle import greedy_tokens

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

PROMPT = [1, 40, 41, 42, 43, 44, 45]
MAX_TOKENS = 12
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": MAX_TOKENS}
# vLLM's extensions: run to max_tokens like the oracle, and return the generated ids.
EXACT = {"ignore_eos": True, "return_token_ids": True}
MESSAGES: list[Any] = [{"role": "user", "content": "tell me a story"}]


@dataclass
class Front:
    client: openai.AsyncOpenAI
    model: str
    adapters: dict[str, Path]
    metrics: InferenceMetrics
    llm: AsyncLLM


@pytest.fixture(scope="module")
async def front(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Front]:
    """The front on 127.0.0.1:0 with adapters alpha@1 and beta@1 installed, the model
    given `PLAIN_CHAT_TEMPLATE`."""
    engine = VllmEngine(vllm_engine)
    cache = tmp_path_factory.mktemp("openai-cache")
    registry = tiny_registry(
        engine, tiny_model_dir, CacheDirectory(cache), served_model_name=tiny_model_dir.name
    )
    adapters = {"alpha": tiny_adapter(rank=8, seed=11), "beta": tiny_adapter(rank=16, seed=12)}
    for name, source in adapters.items():
        await registry.install(copy_revision(source, cache, name, 1).manifest, make_current=True)
    metrics = InferenceMetrics()
    runtime_ref = make_runtime_ref(engine, registry, metrics, replica_id="r")
    try:
        with chat_template(vllm_engine, PLAIN_CHAT_TEMPLATE):
            async with openai_server(runtime_ref, tiny_model_dir.name) as port:
                client = openai.AsyncOpenAI(
                    base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
                )
                try:
                    yield Front(client, tiny_model_dir.name, adapters, metrics, vllm_engine)
                finally:
                    await client.close()
    finally:
        # The engine is shared by the session: leave none of these adapters in it.
        for name in adapters:
            await registry.delete(name)
        await registry.wait_background()


@pytest.fixture(scope="module")
async def oracle(front: Front, tiny_model_dir: Path) -> dict[str, list[int]]:
    """Greedy tokens from transformers + PEFT, by model name (base and each adapter)."""
    sources = {front.model: None, **front.adapters}
    return {
        name: await asyncio.to_thread(greedy_tokens, tiny_model_dir, source, PROMPT, MAX_TOKENS)
        for name, source in sources.items()
    }


@pytest.mark.parametrize("model", ["alpha", "beta@1"])
async def test_completion_from_an_adapter_returns_the_oracle_greedy_tokens(
    front: Front, oracle: dict[str, list[int]], model: str
) -> None:
    completion = await front.client.completions.create(
        model=model, prompt=PROMPT, extra_body=EXACT, **GREEDY
    )
    name = model.partition("@")[0]
    assert completion.model_extra is not None
    assert completion.choices[0].model_extra == {"token_ids": oracle[name]}
    assert completion.model == f"{name}@1"
    assert completion.usage is not None
    assert completion.usage.completion_tokens == MAX_TOKENS


async def test_streamed_completion_from_an_adapter_returns_the_oracle_greedy_tokens(
    front: Front, oracle: dict[str, list[int]]
) -> None:
    stream = await front.client.completions.create(
        model="alpha", prompt=PROMPT, stream=True, extra_body=EXACT, **GREEDY
    )
    tokens: list[int] = []
    async for chunk in stream:
        assert chunk.choices[0].model_extra is not None
        tokens += chunk.choices[0].model_extra["token_ids"]
    assert tokens == oracle["alpha"]
    assert chunk.choices[0].finish_reason == "length"


async def test_base_model_completion_returns_the_oracle_greedy_tokens(
    front: Front, oracle: dict[str, list[int]]
) -> None:
    completion = await front.client.completions.create(
        model=front.model, prompt=PROMPT, extra_body=EXACT, **GREEDY
    )
    assert completion.choices[0].model_extra == {"token_ids": oracle[front.model]}
    assert completion.model == front.model


async def test_streamed_text_equals_the_non_streamed_text_with_usage_last(front: Front) -> None:
    whole = await front.client.completions.create(model="beta", prompt="once upon", **GREEDY)
    stream = await front.client.completions.create(
        model="beta",
        prompt="once upon",
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == []
    assert chunks[-1].usage == whole.usage


async def test_chat_answers_as_the_assistant_from_the_models_template(front: Front) -> None:
    chat = await front.client.chat.completions.create(model="alpha", messages=MESSAGES, **GREEDY)
    completion = await front.client.completions.create(
        model="alpha", prompt=plain_chat_prompt(MESSAGES), **GREEDY
    )
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == completion.choices[0].text
    assert chat.model == "alpha@1"


async def test_streamed_chat_equals_the_non_streamed_chat(front: Front) -> None:
    whole = await front.client.chat.completions.create(
        model=front.model, messages=MESSAGES, **GREEDY
    )
    stream = await front.client.chat.completions.create(
        model=front.model, messages=MESSAGES, stream=True, **GREEDY
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


async def test_models_lists_the_base_model_and_every_adapter(front: Front) -> None:
    models = [model.id async for model in front.client.models.list()]
    assert models == [front.model, "alpha", "beta", "alpha@1", "beta@1"]


async def test_unknown_adapter_is_a_not_found_error(front: Front) -> None:
    with pytest.raises(openai.NotFoundError, match="nope"):
        await front.client.chat.completions.create(model="nope", messages=MESSAGES)


async def test_out_of_range_temperature_is_a_bad_request(front: Front) -> None:
    with pytest.raises(openai.BadRequestError, match="temperature"):
        await front.client.completions.create(model="alpha", prompt="x", temperature=3.0)


async def test_a_prompt_longer_than_the_context_is_a_bad_request(front: Front) -> None:
    with pytest.raises(openai.BadRequestError, match="prompt"):
        await front.client.completions.create(model="alpha", prompt=PROMPT * 100, max_tokens=4)


async def test_closing_a_stream_aborts_the_engine_request(front: Front) -> None:
    registry = front.metrics.registry
    before = engine_work()
    stream, ended = await running_stream(
        lambda: front.client.completions.create(
            model="beta",
            prompt=PROMPT,
            max_tokens=480,
            stream=True,
            extra_body={"ignore_eos": True},
        ),
        finished=lambda first: first.choices[0].finish_reason is not None,
    )
    await stream.close()

    def cancelled() -> float:
        labels = {"adapter": "beta", "code": "CANCELLED"}
        return registry.get_sample_value("loraserve_inference_requests_total", labels) or 0.0

    await eventually(
        lambda: cancelled() == 1.0 and not front.llm.get_num_unfinished_requests(),
        "the cancelled request counted and gone from the engine",
    )
    # vLLM's own count, not the server's: a server that stops reading without aborting
    # passes on as few tokens as one that aborts, while the engine makes all 480.
    work = engine_work() - before
    assert work.finished_requests == ended
    assert 1 <= work.generated_tokens - 480 * ended < 480


TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


async def test_chat_uses_the_models_chat_template_without_a_second_bos(front: Front) -> None:
    tokenizer: Any = front.llm.get_tokenizer()
    rendered = "<s><|user|>tell me a story\n<|assistant|>".replace("<s>", tokenizer.bos_token)
    expected = tokenizer.encode(rendered, add_special_tokens=False)
    with chat_template(front.llm, TEMPLATE):
        chat = await front.client.chat.completions.create(
            model="alpha", messages=MESSAGES, **GREEDY
        )
    assert expected.count(tokenizer.bos_token_id) == 1
    assert chat.usage is not None
    assert chat.usage.prompt_tokens == len(expected)


async def test_messages_a_chat_template_rejects_are_a_bad_request(front: Front) -> None:
    with (
        chat_template(front.llm, "{{ raise_exception('roles must alternate') }}"),
        pytest.raises(openai.BadRequestError, match="roles must alternate"),
    ):
        await front.client.chat.completions.create(model="alpha", messages=MESSAGES)


async def test_chat_with_a_model_without_a_chat_template_is_a_bad_request(front: Front) -> None:
    with (
        chat_template(front.llm, None),
        pytest.raises(openai.BadRequestError, match="provide a chat template"),
    ):
        await front.client.chat.completions.create(model="alpha", messages=MESSAGES)
    assert not front.llm.get_num_unfinished_requests()


async def test_completion_without_max_tokens_generates_16_tokens_as_vllm_serve(
    front: Front,
) -> None:
    completion = await front.client.completions.create(
        model="alpha", prompt=PROMPT, extra_body={"ignore_eos": True}
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 16
    assert completion.choices[0].finish_reason == "length"


class SharedEngine(VllmEngine):
    """The session's engine, which outlives the app."""

    def shutdown(self) -> None:
        pass


async def test_inference_app_serves_the_front_when_the_flag_is_set(
    store_server: RunningStore, vllm_engine: AsyncLLM, tiny_model_dir: Path, tmp_path: Path
) -> None:
    flags = ["--model", str(tiny_model_dir), "--store", store_server.address]
    flags += ["--listen", "127.0.0.1:0", "--adapter-cache", str(tmp_path / "cache")]
    settings = parse_settings(["serve", *flags], {"INFERENCE_OPENAI_LISTEN": "127.0.0.1:0"}, "r")
    release = asyncio.Event()

    async def start_engine(options: EngineOptions) -> VllmEngine:
        await release.wait()
        return SharedEngine(vllm_engine)

    app = InferenceApp(settings, start_engine=start_engine)
    await app.start()
    starting = asyncio.create_task(app.run_engine_and_sync())
    url = f"http://127.0.0.1:{app.openai_port}"
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            assert (await http.get("/health")).status_code == 503
            release.set()
            await asyncio.wait_for(app.ready.wait(), 120)
            assert (await http.get("/health")).status_code == 200
            response = await http.post(
                "/v1/completions",
                json={"model": tiny_model_dir.name, "prompt": "hello", "max_tokens": 2},
            )
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 2
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await app.stop()
