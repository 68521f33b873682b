"""Issue 57, the replica's Generate spans, on real parts: a store and an inference server
on the session's vLLM engine, in-process, traced to an in-process OTLP receiver
(loraserve.testing.inference.traced).

Every Generate, on each front (grpc.aio, the native transport, the OpenAI API), is a
server span in its caller's trace naming the adapter, revision and arm that served it,
and its log lines carry the trace and span ids; a caller's principal is named only with
`--trace-principals`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import httpx
import pytest
from opentelemetry import trace

from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, secure_channel
from loraserve.common.tracing import inject
from loraserve.common.tracing.setup import install_log_correlation
from loraserve.inference.transport.generate import start_generate_front
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import PROMPT, adapter_files
from loraserve.testing.inference.native import native_only
from loraserve.testing.inference.traced import TOKENS, Traced, traced_stack
from loraserve.testing.inference.traced import TRACER as _TRACER
from loraserve.testing.inference.traced import generate_to_end as _generate
from loraserve.testing.inference.traced import trace_id_of as _trace_id
from loraserve.testing.otlp import ReceivedSpan
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.waiting import GUARD_S

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

READER = "reader-secret"


def _span_id(span: trace.Span) -> str:
    return f"{span.get_span_context().span_id:016x}"


async def test_a_generate_is_a_server_span_in_its_callers_trace(traced: Traced) -> None:
    with _TRACER.start_as_current_span("test.caller") as caller:
        revision = await _generate(traced.inference.stub, "alpha", inject([]))

    span = await traced.span("loraserve.generate", _trace_id(caller))
    attributes = span.attributes
    assert span.parent_span_id == _span_id(caller)
    assert attributes["loraserve.adapter"] == "alpha"
    assert attributes["loraserve.revision"] == revision == 1
    assert attributes["loraserve.rollout.arm"] == "current"
    assert attributes["rpc.system"] == "grpc"
    assert attributes["rpc.method"] == "Generate"
    assert attributes["loraserve.code"] == "OK"
    assert attributes["loraserve.admitted"] is True
    assert attributes["gen_ai.usage.input_tokens"] == len(PROMPT)
    assert attributes["gen_ai.usage.output_tokens"] == TOKENS
    assert attributes["gen_ai.response.finish_reasons"] == ["length"]
    assert {"loraserve.wait.queue_s", "loraserve.ttft_s", "loraserve.prefill_s"} <= set(attributes)


async def test_a_generate_names_its_caller_with_trace_principals(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    span = await _span_of_a_reader(
        vllm_engine, tiny_model_dir, tiny_adapter, s3_bucket, tmp_path, "--trace-principals"
    )
    assert span.attributes["enduser.id"] == "app"


async def test_a_generate_names_no_caller_without_trace_principals(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    span = await _span_of_a_reader(vllm_engine, tiny_model_dir, tiny_adapter, s3_bucket, tmp_path)
    assert "enduser.id" not in span.attributes


async def _span_of_a_reader(
    llm: AsyncLLM,
    model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    bucket: S3Bucket,
    tmp_path: Path,
    *extra: str,
) -> ReceivedSpan:
    """The span of a Generate by principal `app` on a replica that takes reader tokens."""
    adapter = adapter_files(tiny_adapter(seed=1))
    flags = ("--reader-token", f"app:{READER}", *extra)
    async with (
        traced_stack(llm, model_dir, adapter, bucket, tmp_path / "cache", flags) as running,
        secure_channel(running.inference.address, ClientSecurity(token=READER)) as channel,
    ):
        await _generate(pb_grpc.InferenceServiceStub(channel), "alpha")
        return await running.span("loraserve.generate")


@native_only
@pytest.mark.parametrize("pushed", [True, False], ids=["pushed", "pulled"])
async def test_a_native_transport_generate_is_a_server_span_in_its_callers_trace(
    traced: Traced, pushed: bool
) -> None:
    front = start_generate_front(
        traced.inference.app.runtime_ref,
        host="127.0.0.1",
        port=0,
        security=ServerSecurity(),
        upstream=None,
        max_connection_age_s=None,
        pushed=pushed,
    )
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{front.port}") as channel:
            with _TRACER.start_as_current_span("test.caller") as caller:
                await _generate(pb_grpc.InferenceServiceStub(channel), "alpha", inject([]))
    finally:
        front.close()

    span = await traced.span("loraserve.generate", _trace_id(caller))
    assert span.parent_span_id == _span_id(caller)
    assert span.attributes["loraserve.transport"] == "native"
    assert span.attributes["loraserve.revision"] == 1
    assert span.attributes["gen_ai.usage.output_tokens"] == TOKENS


async def test_an_openai_completion_is_a_server_span_in_its_callers_trace(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    adapter = adapter_files(tiny_adapter(seed=1))
    flags = ("--openai-listen", "127.0.0.1:0")
    async with traced_stack(
        vllm_engine, tiny_model_dir, adapter, s3_bucket, tmp_path / "cache", flags
    ) as running:
        url = f"http://127.0.0.1:{running.inference.app.openai_port}"
        async with httpx.AsyncClient(base_url=url, timeout=GUARD_S) as http:
            with _TRACER.start_as_current_span("test.caller") as caller:
                body = {"model": "alpha", "prompt": list(PROMPT), "max_tokens": TOKENS}
                reply = await http.post("/v1/completions", json=body, headers=dict(inject([])))
        assert reply.status_code == 200, reply.text
        span = await running.span("loraserve.generate", _trace_id(caller))

    assert span.parent_span_id == _span_id(caller)
    assert span.attributes["http.route"] == "/v1/completions"
    assert span.attributes["loraserve.adapter"] == "alpha"
    assert span.attributes["gen_ai.usage.output_tokens"] == TOKENS


async def test_a_generates_log_lines_carry_its_trace_and_span_ids(
    traced: Traced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="loraserve.inference.serving.generation")
    install_log_correlation()
    with _TRACER.start_as_current_span("test.caller") as caller:
        await _generate(traced.inference.stub, "alpha", inject([]))

    span = await traced.span("loraserve.generate", _trace_id(caller))
    ids = f" trace_id={span.trace_id} span_id={span.span_id}"
    lines = [r for r in caplog.records if r.getMessage().startswith("generate.")]
    assert {r.getMessage().split()[0] for r in lines} == {"generate.started", "generate.finished"}
    assert all(getattr(r, "trace", "") == ids for r in lines)
