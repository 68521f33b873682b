"""Every sampling option answers as vLLM does: gRPC, HTTP and vLLM's AsyncLLM agree.

For each option, one adapter and one prompt (token ids) run through the gRPC
service, the OpenAI completions and chat endpoints, and vLLM's `AsyncLLM` called
directly with the same `SamplingParams`: token ids, text and finish reason of every
choice (and logprobs where asked) must be equal. Where an option changes the answer,
the test also checks vLLM's answer without it differs, so agreeing proves the option
was applied, not ignored.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from loraserve.common.names import parse_adapter_ref
from loraserve.inference.engine import VllmEngine
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving import SERVICE_NAME, register
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.engine import MAX_MODEL_LEN, PLAIN_CHAT_TEMPLATE, chat_template
from loraserve.testing.grpc import serving
from loraserve.testing.inference import (
    copy_revision,
    make_runtime_ref,
    openai_server,
    tiny_registry,
)
from loraserve.testing.inference_fakes import CacheDirectory
from loraserve.testing.models import TinyAdapterFactory

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

ADAPTER = "acme"
PROMPT = [1, 40, 41, 42, 43, 44, 45]
MESSAGES = [{"role": "user", "content": "the quick brown fox"}]
MAX_TOKENS = 8
EOS = 2
SEEDED = {"temperature": 1.0, "seed": 7}
LONG = {"max_tokens": 48}
# Output tokens pinned to EOS, which ignore_eos lets through: special tokens in the text.
EOS_TEXT = {"ignore_eos": True, "logit_bias": {EOS: 100.0}}


@dataclass(frozen=True)
class Choice:
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    logprobs: tuple[float, ...] = ()


Answer = dict[int, Choice]


@dataclass
class Fronts:
    stub: Any
    http: httpx.AsyncClient
    llm: AsyncLLM
    lora: Any
    engine: VllmEngine
    chat_prompt: list[int] = field(default_factory=list)


@pytest.fixture(scope="module")
async def fronts(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Fronts]:
    """gRPC and HTTP fronts on one runtime, adapter `acme` installed."""
    from vllm.lora.request import LoRARequest

    engine = VllmEngine(vllm_engine)
    cache = tmp_path_factory.mktemp("parity-cache")
    registry = tiny_registry(
        engine, tiny_model_dir, CacheDirectory(cache), served_model_name=tiny_model_dir.name
    )
    source = tiny_adapter(rank=8, seed=21)
    await registry.install(copy_revision(source, cache, ADAPTER, 1).manifest, make_current=True)
    async with registry.acquire(parse_adapter_ref(ADAPTER)) as lease:
        assert lease.adapter is not None
        lora = LoRARequest(lease.adapter.lora_name, lease.adapter.lora_int_id, lease.adapter.path)
    runtime_ref = make_runtime_ref(
        engine, registry, InferenceMetrics(CollectorRegistry()), replica_id="p"
    )
    try:
        with chat_template(vllm_engine, PLAIN_CHAT_TEMPLATE):
            async with (
                openai_server(runtime_ref, tiny_model_dir.name) as http_port,
                serving(lambda server: register(server, runtime_ref), [SERVICE_NAME]) as running,
                grpc.aio.insecure_channel(f"127.0.0.1:{running.port}") as channel,
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{http_port}", timeout=300) as http,
            ):
                yield Fronts(
                    pb_grpc.InferenceServiceStub(channel),
                    http,
                    vllm_engine,
                    lora,
                    engine,
                    await engine.chat_prompt_ids(MESSAGES) or [],
                )
    finally:
        # The engine is shared by the session: leave the adapter out of it.
        await registry.delete(ADAPTER)
        await registry.wait_background()


async def direct(fronts: Fronts, prompt: list[int], options: dict[str, Any]) -> Answer:
    """vLLM's AsyncLLM called directly with the same SamplingParams."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    kwargs: dict[str, Any] = {"temperature": 0.0, "max_tokens": MAX_TOKENS} | options
    if "structured" in kwargs:
        kwargs["structured_outputs"] = StructuredOutputsParams(**_structured(kwargs["structured"]))
        del kwargs["structured"]
    params = SamplingParams(**kwargs, output_kind=RequestOutputKind.FINAL_ONLY)
    final = None
    stream = fronts.llm.generate(
        TokensPrompt(prompt_token_ids=prompt), params, uuid.uuid4().hex, lora_request=fronts.lora
    )
    async for output in stream:
        final = output
    assert final is not None
    return {
        c.index: Choice(
            tuple(c.token_ids),
            c.text,
            str(c.finish_reason),
            tuple(_logprob(lp, t) for t, lp in zip(c.token_ids, c.logprobs, strict=True))
            if c.logprobs is not None
            else (),
        )
        for c in final.outputs
    }


def _logprob(scored: Any, token_id: int) -> float:
    return float(scored[token_id].logprob)


def _structured(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: json.dumps(v) if k == "json" else v for k, v in spec.items()}


async def through_grpc(fronts: Fronts, options: dict[str, Any]) -> Answer:
    kwargs: dict[str, Any] = {"temperature": 0.0, "max_tokens": MAX_TOKENS} | options
    if "structured" in kwargs:
        kwargs["structured_output"] = _grpc_structured(kwargs.pop("structured"))
    request = pb.GenerateRequest(
        adapter=ADAPTER, token_ids=pb.TokenIds(ids=PROMPT), sampling=pb.SamplingParams(**kwargs)
    )
    parts: dict[int, list[pb.GenerateResponse]] = {}
    async for message in fronts.stub.Generate(request):
        parts.setdefault(message.index, []).append(message)
    return {
        index: Choice(
            tuple(t for m in messages for t in m.token_ids),
            "".join(m.text for m in messages),
            pb.FinishReason.Name(messages[-1].finish_reason).removeprefix("FINISH_REASON_").lower(),
            tuple(p.token.logprob for m in messages for p in m.logprobs),
        )
        for index, messages in parts.items()
    }


def _grpc_structured(spec: dict[str, Any]) -> pb.StructuredOutput:
    ((kind, value),) = spec.items()
    if kind == "json":
        return pb.StructuredOutput(json_schema=json.dumps(value))
    if kind == "choice":
        return pb.StructuredOutput(choice=pb.Choices(values=value))
    return pb.StructuredOutput(**{kind: value})


def _openai_body(options: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"model": ADAPTER, "temperature": 0.0, "max_tokens": MAX_TOKENS}
    body |= options
    body["return_token_ids"] = True
    if "logit_bias" in body:
        body["logit_bias"] = {str(k): v for k, v in body["logit_bias"].items()}
    if "structured" in body:
        body["structured_outputs"] = body.pop("structured")
    return body


async def through_completions(fronts: Fronts, options: dict[str, Any]) -> Answer:
    response = await fronts.http.post(
        "/v1/completions", json=_openai_body(options) | {"prompt": PROMPT}
    )
    assert response.status_code == 200, response.text
    return {
        c["index"]: Choice(
            tuple(c["token_ids"]),
            c["text"],
            c["finish_reason"],
            tuple(c["logprobs"]["token_logprobs"]) if c["logprobs"] else (),
        )
        for c in response.json()["choices"]
    }


async def through_chat(fronts: Fronts, options: dict[str, Any]) -> Answer:
    body = _openai_body(options) | {"messages": MESSAGES}
    if "logprobs" in body:
        top = body.pop("logprobs")
        body |= {"logprobs": True, "top_logprobs": top}
    response = await fronts.http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return {
        c["index"]: Choice(
            tuple(c["token_ids"]),
            c["message"]["content"],
            c["finish_reason"],
            tuple(t["logprob"] for t in c["logprobs"]["content"]) if c["logprobs"] else (),
        )
        for c in response.json()["choices"]
    }


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


@pytest.fixture(scope="module")
async def greedy(fronts: Fronts) -> list[int]:
    answer = await direct(fronts, PROMPT, {"max_tokens": MAX_TOKENS})
    return list(answer[0].token_ids)


@pytest.mark.parametrize("option", list(CASES))
async def test_option_answers_as_vllm_on_grpc_and_http(
    fronts: Fronts, greedy: list[int], option: str
) -> None:
    case = CASES[option]
    options = case.options(greedy, fronts.engine.decode)
    expected = await direct(fronts, PROMPT, options)
    if case.reference is not None:
        reference = await direct(fronts, PROMPT, case.reference(greedy, fronts.engine.decode))
        assert expected != reference, f"{option} changes nothing here: pick a stronger value"

    assert await through_grpc(fronts, options) == expected
    assert await through_completions(fronts, options) == expected
    assert await direct(fronts, fronts.chat_prompt, options) == await through_chat(fronts, options)


async def test_prompt_logprobs_answer_as_vllm_on_grpc_and_http(fronts: Fronts) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    async for output in fronts.llm.generate(
        TokensPrompt(prompt_token_ids=PROMPT), params, uuid.uuid4().hex, lora_request=fronts.lora
    ):
        final = output
    assert final.prompt_logprobs is not None
    expected: list[float | None] = [None]
    expected += [
        _logprob(lp, t) for t, lp in zip(PROMPT[1:], final.prompt_logprobs[1:], strict=True)
    ]

    request = pb.GenerateRequest(
        adapter=ADAPTER,
        token_ids=pb.TokenIds(ids=PROMPT),
        sampling=pb.SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
    )
    messages = [m async for m in fronts.stub.Generate(request)]
    scored = [p.token.logprob if p.HasField("token") else None for p in messages[0].prompt_logprobs]
    assert scored == expected

    response = await fronts.http.post(
        "/v1/completions",
        json=_openai_body({"max_tokens": 1, "prompt_logprobs": 1}) | {"prompt": PROMPT},
    )
    rendered = response.json()["choices"][0]["prompt_logprobs"]
    assert [
        None if p is None else p[str(t)]["logprob"] for p, t in zip(rendered, PROMPT, strict=True)
    ] == expected


async def test_echo_with_logprobs_scores_the_prompt_then_the_completion(fronts: Fronts) -> None:
    body = _openai_body({"max_tokens": 2, "logprobs": 0}) | {"prompt": PROMPT, "echo": True}
    response = await fronts.http.post("/v1/completions", json=body)
    choice = response.json()["choices"][0]
    greedy = await direct(fronts, PROMPT, {"max_tokens": 2})
    assert choice["text"] == fronts.engine.decode(PROMPT) + greedy[0].text
    logprobs = choice["logprobs"]["token_logprobs"]
    assert len(logprobs) == len(PROMPT) + 2
    assert logprobs[0] is None
    assert (
        tuple(logprobs[-2:])
        == (await direct(fronts, PROMPT, {"max_tokens": 2, "logprobs": 0}))[0].logprobs
    )


async def test_several_prompts_answer_each_as_vllm(fronts: Fronts, greedy: list[int]) -> None:
    other = [1, 300, 17, 88]
    body = _openai_body({}) | {"prompt": [PROMPT, other]}
    response = await fronts.http.post("/v1/completions", json=body)
    choices = response.json()["choices"]
    assert [tuple(c["token_ids"]) for c in choices] == [
        (await direct(fronts, PROMPT, {}))[0].token_ids,
        (await direct(fronts, other, {}))[0].token_ids,
    ]


async def test_stop_token_ids_end_the_issue_example_early(
    fronts: Fronts, greedy: list[int]
) -> None:
    """The issue's example: stop_token_ids stopped vLLM early and was ignored here."""
    stop = greedy[3]
    body = _openai_body({"max_tokens": 24, "stop_token_ids": [stop]}) | {"prompt": PROMPT}
    completion = (await fronts.http.post("/v1/completions", json=body)).json()["choices"][0]
    assert completion["finish_reason"] == "stop"
    assert completion["token_ids"][-1] == stop
    assert len(completion["token_ids"]) < 24
    answer = await through_grpc(fronts, {"max_tokens": 24, "stop_token_ids": [stop]})
    assert answer[0].token_ids == tuple(completion["token_ids"])


async def test_a_prompt_that_nearly_fills_the_context_gets_the_tokens_that_fit(
    fronts: Fronts,
) -> None:
    prompt = [1] + [40] * (MAX_MODEL_LEN - 4)
    body = _openai_body({"max_tokens": 16, "ignore_eos": True}) | {"prompt": prompt}
    response = await fronts.http.post("/v1/completions", json=body)
    assert response.status_code == 200
    choice = response.json()["choices"][0]
    assert (len(choice["token_ids"]), choice["finish_reason"]) == (3, "length")
    request = pb.GenerateRequest(
        adapter=ADAPTER,
        token_ids=pb.TokenIds(ids=prompt),
        sampling=pb.SamplingParams(max_tokens=16, ignore_eos=True),
    )
    messages = [m async for m in fronts.stub.Generate(request)]
    assert messages[-1].usage.completion_tokens == 3
    assert messages[-1].finish_reason == pb.FINISH_REASON_LENGTH


async def test_without_max_tokens_grpc_runs_to_the_context_end(fronts: Fronts) -> None:
    prompt = [1] + [40] * (MAX_MODEL_LEN - 25)
    request = pb.GenerateRequest(
        adapter=ADAPTER,
        token_ids=pb.TokenIds(ids=prompt),
        sampling=pb.SamplingParams(ignore_eos=True, temperature=0.0),
    )
    messages = [m async for m in fronts.stub.Generate(request)]
    assert messages[-1].usage.completion_tokens == MAX_MODEL_LEN - len(prompt)


async def test_without_max_tokens_completions_stop_at_16_as_vllm_serve(fronts: Fronts) -> None:
    prompt = [1] + [40] * (MAX_MODEL_LEN - 25)
    for unset in ({}, {"max_tokens": None}):
        body = {"model": ADAPTER, "prompt": prompt, "ignore_eos": True} | unset
        usage = (await fronts.http.post("/v1/completions", json=body)).json()["usage"]
        assert usage["completion_tokens"] == 16


async def test_chat_without_max_tokens_does_not_stop_at_16(fronts: Fronts) -> None:
    content = "a" * (MAX_MODEL_LEN - 60)
    body = {
        "model": ADAPTER,
        "messages": [{"role": "user", "content": content}],
        "ignore_eos": True,
        "temperature": 0.0,
    }
    answer = (await fronts.http.post("/v1/chat/completions", json=body)).json()
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
    fronts: Fronts, options: dict[str, Any], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await through_grpc(fronts, options)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (caught.value.details() or "")
    response = await fronts.http.post(
        "/v1/completions", json=_openai_body(options) | {"prompt": PROMPT}
    )
    assert response.status_code == 400
    assert field in response.json()["error"]["message"]


async def test_a_prompt_longer_than_the_context_is_invalid_naming_the_prompt(
    fronts: Fronts,
) -> None:
    prompt = [1] + [40] * MAX_MODEL_LEN
    response = await fronts.http.post("/v1/completions", json=_openai_body({}) | {"prompt": prompt})
    assert response.status_code == 400
    assert "prompt" in response.json()["error"]["message"]


async def test_streamed_choices_and_logprobs_equal_the_whole_answer(fronts: Fronts) -> None:
    options = SEEDED | {"n": 3, "logprobs": 1}
    expected = await through_completions(fronts, options)
    body = _openai_body(options) | {"prompt": PROMPT, "stream": True}
    ids: dict[int, list[int]] = {}
    logprobs: dict[int, list[float]] = {}
    async with fronts.http.stream("POST", "/v1/completions", json=body) as response:
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
