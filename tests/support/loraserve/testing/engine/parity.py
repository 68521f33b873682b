"""One adapter behind the gRPC service, the OpenAI endpoints and vLLM's AsyncLLM called
directly, and one way to ask each of them, so tests can compare their answers
(`tests/test_generation_parity.py`, `tests/test_generation_limits.py`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from loraserve.common.revisions.names import parse_adapter_ref
from loraserve.inference.engine import VllmEngine
from loraserve.inference.metrics import InferenceMetrics
from loraserve.inference.serving import SERVICE_NAME, register
from loraserve.inference.v1 import inference_pb2 as pb
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.engine.session import PLAIN_CHAT_TEMPLATE, chat_template
from loraserve.testing.fakes.engine import CacheDirectory
from loraserve.testing.grpc import serving
from loraserve.testing.inference.service import (
    copy_revision,
    make_runtime_ref,
    openai_server,
    tiny_registry,
)

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

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


@asynccontextmanager
async def open_parity_fronts(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    cache: Path,
) -> AsyncIterator[Fronts]:
    """gRPC and HTTP fronts on one runtime, adapter `acme` installed; the adapter leaves
    the (session-shared) engine on exit."""
    from vllm.lora.request import LoRARequest

    engine = VllmEngine(vllm_engine)
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
        await registry.delete(ADAPTER)
        await registry.wait_background()


@pytest.fixture(scope="module")
async def parity_fronts(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Fronts]:
    """`open_parity_fronts` for one test module."""
    cache = tmp_path_factory.mktemp("parity-cache")
    async with open_parity_fronts(vllm_engine, tiny_model_dir, tiny_adapter, cache) as fronts:
        yield fronts


@pytest.fixture(scope="module")
async def parity_greedy_tokens(parity_fronts: Fronts) -> list[int]:
    """vLLM's own greedy answer to PROMPT, MAX_TOKENS long."""
    answer = await direct(parity_fronts, PROMPT, {"max_tokens": MAX_TOKENS})
    return list(answer[0].token_ids)


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
            tuple(scored_logprob(lp, t) for t, lp in zip(c.token_ids, c.logprobs, strict=True))
            if c.logprobs is not None
            else (),
        )
        for c in final.outputs
    }


def scored_logprob(scored: Any, token_id: int) -> float:
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


def openai_body(options: dict[str, Any]) -> dict[str, Any]:
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
        "/v1/completions", json=openai_body(options) | {"prompt": PROMPT}
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
    body = openai_body(options) | {"messages": MESSAGES}
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
