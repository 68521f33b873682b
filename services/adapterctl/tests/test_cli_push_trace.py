"""`adapterctl push --trace`: the push's trace id on stderr and in --json, its spans
(hashing, the value check, each file's upload) exported to a real OTLP receiver before
the command returns, whatever the outcome, and the tracing flags' refusals."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loraserve.adapterctl.failures import EXIT_UNREACHABLE, EXIT_USAGE
from loraserve.testing.adapters.ctl import ctl, write_adapter_dir
from loraserve.testing.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from loraserve.testing.processes.services import free_port
from loraserve.testing.store.server import RunningStore

TRACE_ID = re.compile(r"trace_id=([0-9a-f]{32})\b")


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    async with otlp_receiver() as running:
        yield running


def _printed_trace_id(stderr: str) -> str:
    found = TRACE_ID.findall(stderr)
    assert len(found) == 1, stderr
    return str(found[0])


def _of_trace(receiver: OtlpReceiver, trace_id: str) -> dict[str, list[ReceivedSpan]]:
    spans: dict[str, list[ReceivedSpan]] = {}
    for span in receiver.spans():
        if span.trace_id == trace_id:
            spans.setdefault(span.name, []).append(span)
    return spans


async def _traced_push(
    store_address: str, receiver: OtlpReceiver, directory: Path, *flags: str
) -> tuple[int, str, str]:
    result = await ctl(
        "push",
        "alpha",
        str(directory),
        "--store",
        store_address,
        "--otlp-traces-endpoint",
        receiver.endpoint,
        *flags,
    )
    return result.code, result.out, result.err


async def test_push_trace_prints_the_trace_id_its_spans_carry(
    store_server: RunningStore, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    code, _, err = await _traced_push(
        store_server.address, receiver, write_adapter_dir(tmp_path / "a"), "--trace"
    )
    assert code == 0, err
    trace_id = _printed_trace_id(err)
    # Flushed before the command returned: no waiting for a batch.
    [root] = _of_trace(receiver, trace_id)["loraserve.ctl.push"]
    assert root.parent_span_id == ""
    assert root.service == "loraserve-adapterctl"
    assert root.attributes["loraserve.adapter"] == "alpha"
    assert root.attributes["loraserve.files"] == 2


async def test_push_spans_hashing_value_checks_and_each_file_upload(
    store_server: RunningStore, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    code, _, err = await _traced_push(
        store_server.address, receiver, write_adapter_dir(tmp_path / "a"), "--trace"
    )
    assert code == 0, err
    spans = _of_trace(receiver, _printed_trace_id(err))
    [root] = spans["loraserve.ctl.push"]
    [hashing] = spans["loraserve.ctl.hash"]
    [upload] = spans["loraserve.ctl.upload"]
    assert hashing.parent_span_id == upload.parent_span_id == root.span_id
    hashed = {s.attributes["loraserve.file"]: s for s in spans["loraserve.ctl.hash_file"]}
    assert set(hashed) == {"adapter_config.json", "adapter_model.safetensors"}
    assert all(s.parent_span_id == hashing.span_id for s in hashed.values())
    checks = {s.parent_span_id for s in spans["loraserve.ctl.value_check"]}
    assert checks == {s.span_id for s in hashed.values()}
    sent = spans["loraserve.ctl.upload_file"]
    assert {s.attributes["loraserve.file"] for s in sent} == set(hashed)
    assert all(s.parent_span_id == upload.span_id for s in sent)
    assert upload.attributes["rpc.method"] == "PushAdapter"


async def test_push_json_names_the_trace_id(
    store_server: RunningStore, receiver: OtlpReceiver, tmp_path: Path
) -> None:
    code, out, err = await _traced_push(
        store_server.address, receiver, write_adapter_dir(tmp_path / "a"), "--trace", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["trace_id"] == _printed_trace_id(err)


async def test_push_without_trace_prints_no_trace_id(
    store_server: RunningStore, tmp_path: Path
) -> None:
    result = await ctl(
        "push", "alpha", str(write_adapter_dir(tmp_path / "a")), "--json",
        "--store", store_server.address,
    )  # fmt: skip
    assert result.code == 0, result.err
    assert "trace_id" not in result.err
    assert "trace_id" not in json.loads(result.out)


async def test_failed_push_still_flushes_its_spans(receiver: OtlpReceiver, tmp_path: Path) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    code, _, err = await _traced_push(
        nowhere, receiver, write_adapter_dir(tmp_path / "a"), "--trace", "--timeout", "1"
    )
    assert code == EXIT_UNREACHABLE, err
    [root] = _of_trace(receiver, _printed_trace_id(err))["loraserve.ctl.push"]
    assert root.span.status.code == root.span.status.STATUS_CODE_ERROR


@pytest.mark.parametrize(
    "endpoint", ["collector:4317", "ftp://collector:4317", "http://collector:4317/v1/traces"]
)
async def test_push_refuses_a_bad_otlp_endpoint(tmp_path: Path, endpoint: str) -> None:
    result = await ctl(
        "push", "alpha", str(write_adapter_dir(tmp_path / "a")),
        "--otlp-traces-endpoint", endpoint,
    )  # fmt: skip
    assert result.code == EXIT_USAGE
    assert "--otlp-traces-endpoint" in result.err


async def test_push_refuses_trace_with_watch(tmp_path: Path) -> None:
    result = await ctl("push", "alpha", str(tmp_path), "--trace", "--watch")
    assert result.code == EXIT_USAGE
    assert "--trace" in result.err
