"""What one request may cost, and what a bad one is told, on both fronts over the real
vLLM engine: prompts bounded before they are tokenized, admission by sequences, lone
surrogates, grammars the engine cannot follow, error messages of bounded size.

Each front runs on 127.0.0.1:0 over one runtime (admission of 8 sequences, n at most 4).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from loraserve.common.config.textlimits import MAX_STATUS_MESSAGE_BYTES
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving import SERVICE_NAME, register
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.holding import HoldingEngine
from loraserve.testing.engine.session import MAX_MODEL_LEN
from loraserve.testing.fakes.engine import CacheDirectory
from loraserve.testing.grpc import serving
from loraserve.testing.inference.service import (
    copy_revision,
    make_runtime_ref,
    openai_server,
    tiny_registry,
)
from loraserve.testing.streams import messages

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

ADAPTER = "alpha"
MAX_PENDING = 8
MAX_N = 4


@dataclass
class Fronts:
    stub: Any
    channel: grpc.aio.Channel
    http: httpx.AsyncClient
    llm: AsyncLLM
    metrics: InferenceMetrics
    # The session's engine as the fronts use it: it holds a stream in flight when asked.
    engine: HoldingEngine

    def requests_counted(self, code: str) -> float:
        total = 0.0
        for metric in self.metrics.registry.collect():
            for sample in metric.samples:
                if sample.name == "loraserve_inference_requests_total":
                    total += sample.value if sample.labels["code"] == code else 0.0
        return total


@pytest.fixture(scope="module")
async def fronts(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Fronts]:
    engine = HoldingEngine(vllm_engine, [])
    cache = tmp_path_factory.mktemp("bounds-cache")
    registry = tiny_registry(
        engine, tiny_model_dir, CacheDirectory(cache), served_model_name=tiny_model_dir.name
    )
    source = tiny_adapter(rank=8, seed=31)
    await registry.install(copy_revision(source, cache, ADAPTER, 1).manifest, make_current=True)
    metrics = InferenceMetrics(CollectorRegistry())
    runtime_ref = make_runtime_ref(engine, registry, metrics, max_pending=MAX_PENDING, max_n=MAX_N)
    try:
        async with (
            openai_server(runtime_ref, tiny_model_dir.name) as http_port,
            serving(lambda server: register(server, runtime_ref), [SERVICE_NAME]) as running,
            grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=120) as http,
        ):
            stub = pb_grpc.InferenceServiceStub(channel)
            yield Fronts(stub, channel, http, vllm_engine, metrics, engine)
    finally:
        await registry.delete(ADAPTER)
        await registry.wait_background()


async def grpc_error(fronts: Fronts, request: pb.GenerateRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        async for _ in fronts.stub.Generate(request):
            pass
    return failed.value


def generate(text: str = "hello", **sampling: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        adapter=ADAPTER, text=text, sampling=pb.SamplingParams(max_tokens=4, **sampling)
    )


async def completion(fronts: Fronts, **body: Any) -> httpx.Response:
    return await fronts.http.post(
        "/v1/completions", json={"model": ADAPTER, "prompt": "hello", "max_tokens": 4} | body
    )


def max_chars_per_token(fronts: Fronts) -> int:
    return int(fronts.llm.get_tokenizer().max_chars_per_token)


# -- item 4: a prompt is bounded before it is tokenized ------------------------------


async def test_a_prompt_longer_than_the_context_can_hold_is_refused_by_its_length_unread(
    fronts: Fronts,
) -> None:
    # More characters than MAX_MODEL_LEN tokens of the vocabulary's longest token hold.
    text = "ab " * (MAX_MODEL_LEN * max_chars_per_token(fronts))
    failed = await grpc_error(fronts, generate(text))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"contains {len(text)} characters" in (failed.details() or "")
    response = await completion(fronts, prompt=text)
    assert response.status_code == 400
    assert f"contains {len(text)} characters" in response.json()["error"]["message"]


async def test_a_prompt_over_the_context_is_tokenized_only_one_token_past_it(
    fronts: Fronts,
) -> None:
    # Few enough characters to pass the length bound, many more tokens than the context.
    text = " ".join(str(i % 10) for i in range(MAX_MODEL_LEN * 2))
    assert len(text) <= MAX_MODEL_LEN * max_chars_per_token(fronts)
    failed = await grpc_error(fronts, generate(text))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert f"contains at least {MAX_MODEL_LEN + 1} input tokens" in (failed.details() or "")


# -- item 5: admission counts sequences, n is capped --------------------------------


async def test_a_request_takes_one_admission_slot_per_choice(fronts: Fronts) -> None:
    engine = fronts.engine
    engine.hold(f"{ADAPTER}@1")
    held = []
    try:
        # Two requests hold MAX_N + MAX_N - 1 of the MAX_PENDING sequences: one is left.
        for n in (MAX_N, MAX_N - 1):
            sampling = pb.SamplingParams(max_tokens=4, ignore_eos=True, n=n)
            request = pb.GenerateRequest(adapter=ADAPTER, text="once", sampling=sampling)
            held.append(asyncio.create_task(messages(fronts.stub.Generate(request))))
            await engine.until_held(len(held), *held)
        # The requests below must be admitted or refused, not held.
        engine.held_lora_name = None
        refused = await grpc_error(fronts, generate(n=2))
        fits = await messages(fronts.stub.Generate(generate(n=1)))
    finally:
        engine.let_go()
        await asyncio.gather(*held)

    assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert fits[-1].usage.completion_tokens == 4


async def test_more_choices_than_the_servers_limit_are_an_invalid_argument(
    fronts: Fronts,
) -> None:
    failed = await grpc_error(fronts, generate(n=MAX_N + 1))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-n" in (failed.details() or "")
    response = await completion(fronts, n=MAX_N + 1)
    assert response.status_code == 400
    assert not fronts.llm.get_num_unfinished_requests()


# -- item 10: text that is not Unicode ----------------------------------------------


async def test_a_lone_surrogate_in_a_prompt_is_a_bad_request_never_counted_ok(
    fronts: Fronts,
) -> None:
    counted_ok = fronts.requests_counted("OK")
    body = '{"model": "alpha", "prompt": "hi \\ud800", "max_tokens": 4}'
    response = await fronts.http.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert "surrogate" in response.json()["error"]["message"]
    assert fronts.requests_counted("OK") == counted_ok


async def test_a_prompt_that_is_not_utf8_is_an_invalid_argument_on_grpc(fronts: Fronts) -> None:
    raw = fronts.channel.unary_stream(
        f"/{SERVICE_NAME}/Generate",
        request_serializer=lambda data: data,
        response_deserializer=pb.GenerateResponse.FromString,
    )
    valid = generate("hi X").SerializeToString()
    # The UTF-8 bytes a lone surrogate would have, which protobuf refuses to parse.
    request = valid.replace(b"hi X", b"hi\xed\xa0\x80")
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        async for _ in raw(request):
            pass
    assert failed.value.code() is grpc.StatusCode.INVALID_ARGUMENT


# -- item 11: a grammar that compiles but cannot be followed ------------------------


UNFOLLOWABLE = [
    ("json_schema", json.dumps({"$ref": "#"})),
    ("json_schema", json.dumps({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})),
    ("regex", "[^\\x00-\\U0010FFFF]"),
]


@pytest.mark.parametrize(("kind", "value"), UNFOLLOWABLE, ids=["ref-root", "ref-self", "regex"])
async def test_a_grammar_the_engine_cannot_follow_is_an_invalid_argument(
    fronts: Fronts, kind: str, value: str
) -> None:
    structured = pb.StructuredOutput()
    setattr(structured, kind, value)
    failed = await grpc_error(fronts, generate(structured_output=structured))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "structured_output" in (failed.details() or "")
    http = {"json": json.loads(value)} if kind == "json_schema" else {"regex": value}
    response = await completion(fronts, structured_outputs=http)
    assert response.status_code == 400
    assert "retry-after" not in response.headers


# -- item 12: error messages stay small ---------------------------------------------


async def test_five_thousand_bad_logit_bias_ids_are_refused_in_a_short_message(
    fronts: Fronts,
) -> None:
    bias = {1_000_000 + i: 1.0 for i in range(5000)}
    failed = await grpc_error(fronts, generate(logit_bias=bias))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    message = failed.details() or ""
    assert "1000000" in message
    assert "and 4995 more" in message
    assert len(message.encode()) <= MAX_STATUS_MESSAGE_BYTES
    response = await completion(fronts, logit_bias={str(k): v for k, v in bias.items()})
    assert response.status_code == 400
    assert len(response.json()["error"]["message"].encode()) <= MAX_STATUS_MESSAGE_BYTES


async def test_ten_thousand_bad_words_are_refused_in_a_short_message(fronts: Fronts) -> None:
    words = [f"word{i}" for i in range(10_000)] + [""]
    failed = await grpc_error(fronts, generate(bad_words=words))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert len((failed.details() or "").encode()) <= MAX_STATUS_MESSAGE_BYTES
    response = await completion(fronts, bad_words=words)
    assert response.status_code == 400
    assert len(response.json()["error"]["message"].encode()) <= MAX_STATUS_MESSAGE_BYTES


# -- item 14: small ones ------------------------------------------------------------


async def test_logprobs_minus_one_over_the_limit_names_the_value_asked_for(
    fronts: Fronts,
) -> None:
    failed = await grpc_error(fronts, generate(logprobs=-1))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "logprobs=-1" in (failed.details() or "")


async def test_a_nan_logit_bias_is_an_invalid_argument(fronts: Fronts) -> None:
    failed = await grpc_error(fronts, generate(logit_bias={7: float("nan")}))
    assert failed.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "NaN" in (failed.details() or "")
    body = '{"model": "alpha", "prompt": "hi", "max_tokens": 2, "logit_bias": {"7": NaN}}'
    response = await fronts.http.post(
        "/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
