"""Issue 57, the replica's half of the trace, on real parts: a store and an inference
server on the session's vLLM engine, in-process, whose spans this process exports over
OTLP to an in-process OTLP receiver (loraserve.testing.inference.traced).

A push's trace goes on through the replica that syncs it (event, download URLs,
download, checks, engine load, route flip, parented under the push), in a replica
process too; the first Generate of a newly pushed revision links to the push's trace,
and a revision routed lazily loads under it. The Generate spans themselves are tested in
test_tracing_replica_generate.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from loraserve.testing.adapters.models import TinyAdapterFactory
from loraserve.testing.inference.app import adapter_files
from loraserve.testing.inference.traced import REPLICA, Traced, Traces, traced_stack
from loraserve.testing.inference.traced import generate_to_end as _generate
from loraserve.testing.otlp import otlp_receiver
from loraserve.testing.processes.services import inference_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import running_store
from loraserve.testing.tracing import exporting_spans
from loraserve.testing.waiting import eventually

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

pytestmark = pytest.mark.engine


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
