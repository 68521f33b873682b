"""A store and an in-process replica on the session's vLLM engine whose spans this
process exports over OTLP (`exporting_spans`, what `--otlp-traces-endpoint` starts in a
server process) to an in-process OTLP receiver, for the replica's tracing tests
(tests/reliability/test_tracing_replica*.py): the `traced` fixture, `traced_stack` for a
test's own flags, and what those tests read of the spans."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from opentelemetry import trace

from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as store_grpc
from loraserve.common.tracing import TRACING_INTERCEPTORS
from loraserve.testing.adapters.files import AdapterFiles
from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import RunningInference, adapter_files, greedy, inference_app
from loraserve.testing.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import push
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.tracing import exporting_spans
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

REPLICA = "traced-replica"
TOKENS = 4
TRACER = trace.get_tracer(__name__)


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
        with TRACER.start_as_current_span("test.push") as root:
            async with grpc.aio.insecure_channel(self.store.address, interceptors=carrying) as ch:
                response = await push(store_grpc.AdapterStoreServiceStub(ch), name, files)
        return trace_id_of(root), int(response.revision.revision)


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


def trace_id_of(span: trace.Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


async def generate_to_end(stub: Any, adapter: str, metadata: Sequence[tuple[str, str]] = ()) -> int:
    """Runs a greedy Generate to its end; the revision that served it."""
    revision = 0
    async for message in stub.Generate(greedy(adapter, TOKENS), metadata=metadata, timeout=60):
        revision = revision or message.revision
    return revision
