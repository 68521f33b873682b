"""Issue 57, the replica's half of the trace, on real parts: a store and an inference
server on the session's vLLM engine, in-process, whose spans this process exports over
OTLP (`exporting_spans`, what `--otlp-traces-endpoint` starts in a server process) to
an in-process OTLP receiver.

A push's trace goes on through the replica that syncs it (event, download URLs,
download, checks, engine load, route flip, parented under the push); every Generate,
on each front, is a server span in its caller's trace naming the adapter, revision and
arm that served it; the first Generate of a newly pushed revision links to the push's
trace; a caller's principal is named only with `--trace-principals`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import httpx
import pytest
from opentelemetry import trace

from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.common.rpc.security import ClientSecurity, ServerSecurity, secure_channel
from loraserve.common.tracing import TRACING_INTERCEPTORS, inject
from loraserve.common.tracing.setup import install_log_correlation
from loraserve.inference.transport.generate import start_generate_front
from loraserve.inference.v1 import inference_pb2_grpc as pb_grpc
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import (
    PROMPT,
    RunningInference,
    adapter_files,
    greedy,
    inference_app,
)
from loraserve.testing.inference.native import native_only
from loraserve.testing.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from loraserve.testing.processes.services import inference_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.tracing import exporting_spans
from loraserve.testing.waiting import GUARD_S, eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine

REPLICA = "traced-replica"
READER = "reader-secret"
TOKENS = 4
_TRACER = trace.get_tracer(__name__)


@dataclass
class Traces:
    """A store whose spans, and its replicas', reach `receiver`."""

    receiver: OtlpReceiver
    store: RunningStore

    async def span(self, name: str, trace_id: str = "", **attributes: Any) -> ReceivedSpan:
        """The last span named `name` (of `trace_id`, with `attributes`), once one arrived."""
        found: list[ReceivedSpan] = []

        def arrived() -> bool:
            found[:] = [
                s
                for s in self.receiver.spans(name)
                if (not trace_id or s.trace_id == trace_id)
                and all(s.attributes.get(k) == v for k, v in attributes.items())
            ]
            return bool(found)

        await eventually(arrived, f"a span {name} of trace {trace_id or 'any'} with {attributes}")
        return found[-1]

    def spans_of(self, trace_id: str) -> dict[str, list[ReceivedSpan]]:
        by_name: dict[str, list[ReceivedSpan]] = {}
        for span in self.receiver.spans():
            if span.trace_id == trace_id:
                by_name.setdefault(span.name, []).append(span)
        return by_name

    async def traced_push(self, name: str, files: AdapterFiles) -> tuple[str, int]:
        """Pushes under a span of the test's own, as `adapterctl push --trace` does:
        the push's trace id, and the revision."""
        # The channel carries the context as adapterctl's does (this process, unlike a
        # server's, never turns propagation on for every channel it opens).
        carrying = [kind() for kind in TRACING_INTERCEPTORS]
        with _TRACER.start_as_current_span("test.push") as root:
            async with grpc.aio.insecure_channel(self.store.address, interceptors=carrying) as ch:
                response = await push(store_grpc.AdapterStoreServiceStub(ch), name, files)
        return _trace_id(root), int(response.revision.revision)


@dataclass
class Traced(Traces):
    """A store and an in-process replica whose spans reach `receiver`."""

    inference: RunningInference


@asynccontextmanager
async def traced_stack(
    llm: AsyncLLM,
    model_dir: Path,
    adapter: AdapterFiles,
    bucket: S3Bucket,
    cache: Path,
    extra: Sequence[str] = (),
) -> AsyncIterator[Traced]:
    """A store and a replica serving `alpha` (revision 1), traced to a receiver."""
    async with (
        otlp_receiver() as receiver,
        exporting_spans(receiver.endpoint),
        running_store(bucket) as store,
        inference_app(
            llm,
            model_dir=model_dir,
            store_address=store.address,
            cache_dir=cache,
            replica_id=REPLICA,
            pushed={"alpha": adapter},
            extra=("--otlp-traces-endpoint", receiver.endpoint, *extra),
        ) as inference,
    ):
        yield Traced(receiver, store, inference)


@pytest.fixture
async def traced(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> AsyncIterator[Traced]:
    adapter = adapter_files(tiny_adapter(seed=1))
    async with traced_stack(
        vllm_engine, tiny_model_dir, adapter, s3_bucket, tmp_path / "cache"
    ) as running:
        yield running


def _trace_id(span: trace.Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


def _span_id(span: trace.Span) -> str:
    return f"{span.get_span_context().span_id:016x}"


async def _generate(stub: Any, adapter: str, metadata: Sequence[tuple[str, str]] = ()) -> int:
    """Runs a greedy Generate to its end; the revision that served it."""
    revision = 0
    async for message in stub.Generate(greedy(adapter, TOKENS), metadata=metadata, timeout=60):
        revision = revision or message.revision
    return revision


async def test_a_pushed_revision_is_synced_under_the_pushs_trace(
    traced: Traced, tiny_adapter: TinyAdapterFactory
) -> None:
    trace_id, revision = await traced.traced_push("beta", adapter_files(tiny_adapter(seed=2)))

    # The sync span ends last, and spans are exported in the order they end.
    sync = await traced.span("loraserve.replica.sync", trace_id)
    spans = traced.spans_of(trace_id)
    ids = {s.span_id: s for named in spans.values() for s in named}
    (event,) = spans["loraserve.replica.event"]
    (install,) = spans["loraserve.replica.install"]
    (download,) = spans["loraserve.replica.download"]
    (urls,) = spans["loraserve.replica.download_urls"]
    (engine_load,) = spans["loraserve.replica.engine_load"]
    (route,) = spans["loraserve.replica.route"]
    checks = {s.attributes["loraserve.check"]: s for s in spans["loraserve.replica.verify"]}
    assert ids[sync.parent_span_id].name == "loraserve.store.push"
    assert sync.attributes["loraserve.adapter"] == "beta"
    assert sync.attributes["loraserve.revision"] == revision
    assert sync.attributes["loraserve.replica"] == REPLICA
    assert sync.attributes["loraserve.loaded"] is True
    assert event.parent_span_id == sync.span_id
    assert install.parent_span_id == sync.span_id
    assert install.attributes["loraserve.tier"] == "store"
    assert download.parent_span_id == install.span_id
    assert download.attributes["loraserve.files"] == 2
    assert download.attributes["loraserve.bytes"] > 0
    assert urls.parent_span_id == download.span_id
    assert checks.keys() == {"sha256", "values"}
    assert all(check.parent_span_id == install.span_id for check in checks.values())
    assert engine_load.parent_span_id == install.span_id
    assert route.parent_span_id == install.span_id


async def test_a_replica_process_continues_the_pushs_trace_both_ways(
    tiny_model_dir: Path, tiny_adapter: TinyAdapterFactory, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    """`inference serve --otlp-traces-endpoint` as its own process: its sync spans sit
    under the in-process store's push span, and the store's span of the download URLs
    the replica asked for sits under the replica's."""
    adapter = adapter_files(tiny_adapter(seed=1))
    async with (
        otlp_receiver() as receiver,
        exporting_spans(receiver.endpoint),
        running_store(s3_bucket) as store,
        inference_process(
            tiny_model_dir,
            store.address,
            tmp_path / "cache",
            tmp_path / "inference.log",
            extra=("--otlp-traces-endpoint", receiver.endpoint),
            env={"OTEL_BSP_SCHEDULE_DELAY": "100"},
        ),
    ):
        traced = Traces(receiver, store)
        trace_id, _ = await traced.traced_push("alpha", adapter)
        sync = await traced.span("loraserve.replica.sync", trace_id)
        asked = await traced.span("loraserve.replica.download_urls", trace_id)
        signed = await traced.span("loraserve.store.download_urls", trace_id)
        push_span = await traced.span("loraserve.store.push", trace_id)

    assert sync.service == "loraserve-inference"
    assert sync.parent_span_id == push_span.span_id
    assert signed.parent_span_id == asked.span_id


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


async def test_only_the_first_generate_of_a_pushed_revision_links_to_the_push(
    traced: Traced, tiny_adapter: TinyAdapterFactory
) -> None:
    trace_id, revision = await traced.traced_push("beta", adapter_files(tiny_adapter(seed=2)))
    sync = await traced.span("loraserve.replica.sync", trace_id)

    async def routed() -> bool:
        return await traced.inference.current("beta") == revision

    await eventually(routed, f"beta@{revision} routed")

    assert await _generate(traced.inference.stub, "beta") == revision
    first = await traced.span("loraserve.generate", **{"loraserve.adapter": "beta"})
    assert await _generate(traced.inference.stub, "beta") == revision
    await eventually(
        lambda: len(traced.receiver.spans("loraserve.generate")) >= 2, "the second Generate"
    )
    second = [s for s in traced.receiver.spans("loraserve.generate") if s is not first][-1]

    assert first.links == [(trace_id, sync.span_id)]
    assert first.trace_id != trace_id, "its own request, not a child of the push"
    assert second.links == []


async def test_a_lazily_routed_revision_loads_under_its_first_generate(
    vllm_engine: AsyncLLM,
    tiny_model_dir: Path,
    tiny_adapter: TinyAdapterFactory,
    s3_bucket: S3Bucket,
    tmp_path: Path,
) -> None:
    adapter = adapter_files(tiny_adapter(seed=1))
    flags = ("--prefetch-adapters", "0")
    async with traced_stack(
        vllm_engine, tiny_model_dir, adapter, s3_bucket, tmp_path / "cache", flags
    ) as running:
        trace_id, revision = await running.traced_push("beta", adapter_files(tiny_adapter(seed=2)))
        sync = await running.span("loraserve.replica.sync", trace_id)
        assert await _generate(running.inference.stub, "beta") == revision
        generate = await running.span("loraserve.generate", **{"loraserve.adapter": "beta"})
        install = await running.span("loraserve.replica.install", generate.trace_id)

    assert sync.attributes["loraserve.loaded"] is False
    assert install.parent_span_id == generate.span_id
    assert generate.links == [(trace_id, sync.span_id)]


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
