"""Issue 57, the publish half of a push's trace: `adapterctl push --trace` against a real
`adapterstore serve` process exporting to a real OTLP receiver. One trace id runs from
adapterctl's root span through the store's server span to its commit and object
storage requests; the change the push committed carries that trace to every watcher
(where replicas continue it), even from a store that traces nothing itself; and the
store's log lines of the push name the trace."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loraserve.clients.store import EventKind, StoreClient, StoreClientSettings, StoreEvent
from loraserve.common.rpc.security import ClientSecurity
from loraserve.testing.adapters.ctl import ctl, write_adapter_dir
from loraserve.testing.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from loraserve.testing.processes.services import StoreProcess, store_process
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.waiting import GUARD_S, eventually

pytestmark = [pytest.mark.slow]

TRACE_ID = re.compile(r"trace_id=([0-9a-f]{32})\b")
# traceparent: version-trace id-parent span id-flags (sampled: the low bit).
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f][13579bdf]")


@dataclass(frozen=True)
class TracedStore:
    store: StoreProcess
    receiver: OtlpReceiver


@pytest.fixture(scope="module")
async def traced_store(
    module_s3_bucket: S3Bucket, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[TracedStore]:
    """`adapterstore serve --otlp-traces-endpoint` at a receiver, batches every 50 ms."""
    log_path = tmp_path_factory.mktemp("traced-store") / "store.log"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        async with (
            otlp_receiver() as receiver,
            store_process(
                module_s3_bucket, log_path, extra=["--otlp-traces-endpoint", receiver.endpoint]
            ) as store,
        ):
            yield TracedStore(store, receiver)


@pytest.fixture
async def untraced_store(s3_bucket: S3Bucket, tmp_path: Path) -> AsyncIterator[StoreProcess]:
    """`adapterstore serve` with no endpoint, and none in its environment."""
    with pytest.MonkeyPatch.context() as env:
        for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
            env.delenv(name, raising=False)
        env.delenv("ADAPTERSTORE_OTLP_TRACES_ENDPOINT", raising=False)
        async with store_process(s3_bucket, tmp_path / "store.log") as store:
            yield store


async def _push(
    address: str, name: str, directory: Path, receiver: OtlpReceiver, *flags: str
) -> str:
    """Pushes with `--trace`, adapterctl's spans to `receiver`; the printed trace id."""
    result = await ctl(
        "push", name, str(directory), "--trace", "--store", address,
        "--otlp-traces-endpoint", receiver.endpoint, *flags,
    )  # fmt: skip
    assert result.code == 0, result.err
    [trace_id] = TRACE_ID.findall(result.err)
    return str(trace_id)


async def _trace(receiver: OtlpReceiver, trace_id: str, last: str) -> dict[str, ReceivedSpan]:
    """The spans of `trace_id` by name (one each), once the span `last` has arrived."""

    def arrived() -> bool:
        return any(s.name == last and s.trace_id == trace_id for s in receiver.spans())

    await eventually(arrived, f"span {last} of trace {trace_id}")
    spans: dict[str, ReceivedSpan] = {}
    for span in receiver.spans():
        if span.trace_id == trace_id:
            spans.setdefault(span.name, span)
    return spans


@contextlib.asynccontextmanager
async def _watching(address: str) -> AsyncIterator[asyncio.Queue[StoreEvent]]:
    """The events of a watch from the store's head on, as a replica's sync reads them."""
    settings = StoreClientSettings(address, ClientSecurity(), "watcher")
    client = StoreClient.connect(settings)
    events: asyncio.Queue[StoreEvent] = asyncio.Queue()
    listing = await client.list_adapters()

    async def follow() -> None:
        async for item in client.watch(listing.seq, listing.incarnation):
            if isinstance(item, StoreEvent):
                events.put_nowait(item)

    following = asyncio.create_task(follow())
    try:
        yield events
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        await client.close()


async def _pushed_event(events: asyncio.Queue[StoreEvent], name: str) -> StoreEvent:
    async with asyncio.timeout(GUARD_S):
        while True:
            event = await events.get()
            if event.kind is EventKind.REVISION_PUSHED and event.name == name:
                return event


async def test_push_trace_runs_from_adapterctl_through_the_store_to_its_commit(
    traced_store: TracedStore, tmp_path: Path
) -> None:
    receiver = traced_store.receiver
    trace_id = await _push(
        traced_store.store.address, "parented", write_adapter_dir(tmp_path / "a"), receiver
    )
    spans = await _trace(receiver, trace_id, "loraserve.store.push")
    root, upload = spans["loraserve.ctl.push"], spans["loraserve.ctl.upload"]
    served = spans["loraserve.store.push"]
    assert root.parent_span_id == ""
    assert upload.parent_span_id == root.span_id
    # Across the process boundary: the store's server span continues adapterctl's call.
    assert served.parent_span_id == upload.span_id
    assert (root.service, served.service) == ("loraserve-adapterctl", "loraserve-adapterstore")
    assert served.attributes["rpc.method"] == "PushAdapter"
    assert served.attributes["loraserve.adapter"] == "parented"
    assert served.attributes["loraserve.revision"] == 1
    for step in ("validate", "receive", "keep", "commit"):
        assert spans[f"loraserve.store.{step}"].parent_span_id == served.span_id, step
    commit = spans["loraserve.store.commit"]
    # The log entry's conditional PUT, by kind, under the commit.
    entry_put = spans["loraserve.store.s3.put_if_absent"]
    assert entry_put.parent_span_id == commit.span_id
    assert entry_put.attributes["rpc.method"] == "PutObject"
    assert entry_put.attributes["loraserve.bytes"] > 0


async def test_pushed_change_carries_the_push_span_to_watchers(
    traced_store: TracedStore, tmp_path: Path
) -> None:
    address, receiver = traced_store.store.address, traced_store.receiver
    async with _watching(address) as events:
        trace_id = await _push(address, "watched", write_adapter_dir(tmp_path / "a"), receiver)
        event = await _pushed_event(events, "watched")
    served = (await _trace(receiver, trace_id, "loraserve.store.push"))["loraserve.store.push"]
    match = TRACEPARENT.fullmatch(event.trace_parent)
    assert match is not None, event.trace_parent
    assert match.groups() == (trace_id, served.span_id)


async def test_store_with_tracing_off_still_passes_the_push_trace_to_watchers(
    untraced_store: StoreProcess, tmp_path: Path
) -> None:
    async with otlp_receiver() as receiver, _watching(untraced_store.address) as events:
        trace_id = await _push(
            untraced_store.address, "passed", write_adapter_dir(tmp_path / "a"), receiver
        )
        event = await _pushed_event(events, "passed")
        spans = receiver.spans()
    match = TRACEPARENT.fullmatch(event.trace_parent)
    assert match is not None, event.trace_parent
    # The store recorded nothing: the traceparent names adapterctl's upload span.
    [upload] = [s for s in spans if s.name == "loraserve.ctl.upload"]
    assert match.groups() == (trace_id, upload.span_id)
    assert not [s for s in spans if s.service != "loraserve-adapterctl"]


async def test_store_without_an_endpoint_starts_no_exporter(
    untraced_store: StoreProcess, tmp_path: Path
) -> None:
    result = await ctl(
        "push", "plain", str(write_adapter_dir(tmp_path / "a")),
        "--store", untraced_store.address,
    )  # fmt: skip
    assert (result.code, result.out.strip()) == (0, "plain@1"), result.err
    await eventually(lambda: "adapter.pushed name=plain" in untraced_store.log_text(), "pushed")
    assert "tracing.started" not in untraced_store.log_text()
    assert "trace_id=" not in untraced_store.log_text()


async def test_store_log_lines_of_a_traced_push_carry_its_trace_id(
    traced_store: TracedStore, tmp_path: Path
) -> None:
    store = traced_store.store
    trace_id = await _push(
        store.address, "logged", write_adapter_dir(tmp_path / "a"), traced_store.receiver
    )

    def pushed_line() -> str:
        lines = store.log_text().splitlines()
        return next((line for line in lines if "adapter.pushed name=logged " in line), "")

    await eventually(lambda: bool(pushed_line()), "the store's adapter.pushed line")
    assert f"trace_id={trace_id}" in pushed_line()


async def test_push_span_names_no_principal_by_default(
    traced_store: TracedStore, tmp_path: Path
) -> None:
    receiver = traced_store.receiver
    trace_id = await _push(
        traced_store.store.address, "unnamed", write_adapter_dir(tmp_path / "a"), receiver
    )
    served = (await _trace(receiver, trace_id, "loraserve.store.push"))["loraserve.store.push"]
    assert "enduser.id" not in served.attributes


async def test_push_span_names_the_pusher_with_trace_principals(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        async with (
            otlp_receiver() as receiver,
            store_process(
                s3_bucket,
                tmp_path / "store.log",
                extra=[
                    "--otlp-traces-endpoint", receiver.endpoint, "--trace-principals",
                    "--writer-token", "alice:s3cret",
                ],
            ) as store,
        ):  # fmt: skip
            result = await ctl(
                "push", "named", str(write_adapter_dir(tmp_path / "a")), "--trace",
                "--store", store.address, env={"ADAPTERCTL_TOKEN": "s3cret"},
            )  # fmt: skip
            assert result.code == 0, result.err
            [trace_id] = TRACE_ID.findall(result.err)
            spans = await _trace(receiver, trace_id, "loraserve.store.push")
    assert spans["loraserve.store.push"].attributes["enduser.id"] == "alice"
