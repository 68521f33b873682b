"""What servers say never drives the operator's terminal: every string a store (or
whoever wrote to it) supplied is printed with its control characters escaped.
adapterctl against a real store server (gRPC on 127.0.0.1, S3 over moto HTTP)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from loraserve.adapterctl.failures import EXIT_OK
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.testing.adapters.ctl import CtlResult, ctl, write_adapter_dir
from loraserve.testing.adapters.files import lora_config
from loraserve.testing.store.server import RunningStore
from loraserve.testing.store.statuses import refused, report_request

# Clears the screen, then sets the window title: what a hostile reason would send.
CLEAR = "\x1b[2J"
HOSTILE = f"rank too big{CLEAR}\x1b]0;owned\x07"
SHOWN = "rank too big\\x1b[2J\\x1b]0;owned\\x07"
# A newline and a forged row: a cell must stay one row's cell.
FORGED_ROW = "\nalpha  replica-z  live"


async def _run(store: RunningStore, *argv: str) -> CtlResult:
    result = await ctl(*argv, env={"ADAPTERSTORE_ADDR": store.address})
    assert result.code == EXIT_OK, result.err
    return result


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F]


async def test_status_shows_a_nack_reason_with_its_control_characters_escaped(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _run(store_server, "push", "alpha", str(write_adapter_dir(tmp_path)))
    async with grpc.aio.insecure_channel(store_server.address) as channel:
        stub = pb_grpc.AdapterStoreServiceStub(channel)
        report = refused(1, HOSTILE + FORGED_ROW)
        await stub.ReportReplicaStatus(report_request("replica-a", {"alpha": report}))
    result = await _run(store_server, "status", "alpha")
    assert _raw_controls(result.out) == []
    [row] = result.out.splitlines()[1:]
    assert SHOWN + "\\nalpha  replica-z  live" in row


async def test_revisions_show_a_description_with_its_control_characters_escaped(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = str(write_adapter_dir(tmp_path))
    await _run(store_server, "push", "alpha", adapter, "--description", HOSTILE + FORGED_ROW)
    result = await _run(store_server, "revisions", "alpha")
    assert _raw_controls(result.out) == []
    [row] = result.out.splitlines()[1:]
    assert row.endswith(SHOWN + "\\nalpha  replica-z  live")


async def test_list_shows_a_base_model_with_its_control_characters_escaped(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    config = lora_config(base_model_name_or_path=f"tiny{CLEAR}\u202eledom")
    (adapter / "adapter_config.json").write_bytes(config)
    await _run(store_server, "push", "alpha", str(adapter))
    result = await _run(store_server, "list")
    assert _raw_controls(result.out) == []
    assert "\u202e" not in result.out
    assert "tiny\\x1b[2J\\u202eledom" in result.out


async def test_rollout_status_shows_an_abort_reason_with_its_control_characters_escaped(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _run(store_server, "push", "alpha", str(write_adapter_dir(tmp_path / "1")))
    second = str(write_adapter_dir(tmp_path / "2", seed=2))
    await _run(store_server, "push", "alpha", second, "--no-promote")
    await _run(store_server, "rollout", "start", "alpha", "2", "--weight", "20")
    await _run(store_server, "rollout", "abort", "alpha", "--reason", HOSTILE + FORGED_ROW)
    result = await _run(store_server, "rollout", "status", "alpha")
    assert _raw_controls(result.out) == []
    [ended] = [line for line in result.out.splitlines() if line.startswith("aborted")]
    assert ended.endswith(SHOWN + "\\nalpha  replica-z  live")


async def test_json_output_escapes_what_json_leaves_raw_and_reads_back_the_same(
    store_server: RunningStore, tmp_path: Path
) -> None:
    # JSON escapes C0 by itself; DEL, C1 (U+009B is a CSI) and bidi overrides it does not.
    description = f"{CLEAR}\x7f\x9b2J\u202eevil"
    adapter = str(write_adapter_dir(tmp_path))
    await _run(store_server, "push", "alpha", adapter, "--description", description)
    result = await _run(store_server, "revisions", "alpha", "--json")
    assert _raw_controls(result.out.rstrip("\n")) == []
    assert "\u202e" not in result.out
    assert json.loads(result.out)["revisions"][0]["description"] == description
