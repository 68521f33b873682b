"""The OpenAI-compatible front's refusals (400, 401, 404, 429, 503) and its address parsing.

The real engine's answers through this front are tested in tests/test_openai_front.py.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from loraserve.common.rpc.metrics_http import split_address
from loraserve.common.rpc.security import ServerSecurity, Token
from loraserve.testing.fakes.engine import FakeEngine
from loraserve.testing.inference.openai_front import CHAT, MODEL, StartFront, _post
from loraserve.testing.waiting import eventually

READER = "reader-secret"


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


def test_addresses_split_into_host_and_port() -> None:
    assert split_address("0.0.0.0:8000") == ("0.0.0.0", 8000)
    assert split_address("[::1]:0") == ("::1", 0)
