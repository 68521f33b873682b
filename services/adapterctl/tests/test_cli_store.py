"""adapterctl against a real store server (gRPC on 127.0.0.1, S3 over moto HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import struct
from pathlib import Path

import grpc

from loraserve.adapterctl.cli import run
from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_NOT_ALLOWED, EXIT_USAGE
from loraserve.adapterstore.catalog.pagetokens import DEFAULT_PAGE_SIZE
from loraserve.adapterstore.v1 import adapterstore_pb2_grpc as pb_grpc
from loraserve.common.rpc.security import ServerSecurity, parse_tokens
from loraserve.testing.adapters.badpushes import nested_json
from loraserve.testing.adapters.ctl import buffers, ctl, output, write_adapter_dir
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.server import RunningStore, running_store
from loraserve.testing.store.statuses import refused, report_request, write_statuses
from loraserve.testing.waiting import eventually

WEIGHTS = "adapter_model.safetensors"
# Replicas whose statuses fill three pages at the store's default page size: enough to
# show `status` follows every page.
PAGED_REPLICAS = 250


def _env(store: RunningStore) -> dict[str, str]:
    return {"ADAPTERSTORE_ADDR": store.address}


async def _push(store: RunningStore, name: str, directory: Path, *flags: str) -> str:
    result = await ctl("push", name, str(directory), *flags, env=_env(store))
    assert result.code == 0, result.err
    return result.out.strip()


async def test_push_prints_name_at_revision(store_server: RunningStore, tmp_path: Path) -> None:
    adapter = write_adapter_dir(tmp_path / "a")
    assert await _push(store_server, "alpha", adapter) == "alpha@1"
    assert await _push(store_server, "alpha", write_adapter_dir(tmp_path / "b", seed=1)) == (
        "alpha@2"
    )


async def test_pushed_revision_records_the_files_sha256(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    await _push(store_server, "alpha", adapter, "--description", "first try")
    result = await ctl("revisions", "alpha", "--json", env=_env(store_server))
    revision = json.loads(result.out)["revisions"][0]
    assert {f["name"]: f["sha256"] for f in revision["files"]} == {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in adapter.iterdir()
    }
    assert revision["description"] == "first try"


async def test_list_shows_pushed_adapters(store_server: RunningStore, tmp_path: Path) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "a"))
    await _push(store_server, "beta", write_adapter_dir(tmp_path / "b", seed=1))
    result = await ctl("list", env=_env(store_server))
    lines = result.out.splitlines()
    assert lines[0].split() == ["NAME", "CURRENT", "LATEST", "RANK", "BASE", "MODEL", "UPDATED"]
    assert [line.split()[:3] for line in lines[1:]] == [["alpha", "1", "1"], ["beta", "1", "1"]]


async def test_list_json_reflects_current_and_latest(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "a"))
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "b", seed=1), "--no-promote")
    data = json.loads((await ctl("list", "--json", env=_env(store_server))).out)
    [adapter] = data["adapters"]
    assert (adapter["name"], adapter["current_revision"], adapter["latest_revision"]) == (
        "alpha",
        1,
        2,
    )
    assert data["seq"] == 2


async def test_revisions_lists_newest_first_and_marks_current(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "a"))
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "b", seed=1), "--no-promote")
    result = await ctl("revisions", "alpha", env=_env(store_server))
    rows = [line.split() for line in result.out.splitlines()[1:]]
    assert [row[0] for row in rows] == ["2", "1"]
    assert rows[1][1] == "*"
    assert "*" not in rows[0]


async def test_rollback_moves_current(store_server: RunningStore, tmp_path: Path) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "a"))
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "b", seed=1))
    result = await ctl("rollback", "alpha", "1", env=_env(store_server))
    assert (result.code, result.out) == (0, "alpha@1\n")
    revisions = json.loads((await ctl("revisions", "alpha", "--json", env=_env(store_server))).out)
    assert revisions["current_revision"] == 1


async def test_rollback_with_stale_expected_current_is_aborted(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "a"))
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "b", seed=1))
    result = await ctl("rollback", "alpha", "1", "--expect-current", "1", env=_env(store_server))
    assert result.code == EXIT_FAILED
    assert result.err.startswith("adapterctl: error: ABORTED: ")
    assert result.err.count("\n") == 1


async def test_delete_removes_the_adapter(store_server: RunningStore, tmp_path: Path) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path))
    result = await ctl("delete", "alpha", "--yes", env=_env(store_server))
    assert (result.code, result.out) == (0, "deleted alpha\n")
    listed = json.loads((await ctl("list", "--json", env=_env(store_server))).out)
    assert listed["adapters"] == []


async def test_delete_after_confirmation_on_a_terminal(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path))
    result = await ctl("delete", "alpha", env=_env(store_server), stdin="yes\n", tty=True)
    assert result.code == 0
    assert "Delete adapter 'alpha' and all its revisions? [y/N]" in result.err


async def test_unknown_adapter_is_one_line_not_found(store_server: RunningStore) -> None:
    result = await ctl("revisions", "ghost", env=_env(store_server))
    assert result.code == EXIT_FAILED
    assert result.out == ""
    assert result.err.startswith("adapterctl: error: NOT_FOUND: ")
    assert "ghost" in result.err
    assert result.err.count("\n") == 1


async def test_adapter_the_store_rejects_is_one_line_invalid_argument(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["r"] = 8  # the weights are rank 4
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    result = await ctl("push", "alpha", str(adapter), env=_env(store_server))
    assert result.code == EXIT_FAILED
    assert result.err.startswith("adapterctl: error: INVALID_ARGUMENT: ")
    assert "rank r=8" in result.err
    assert result.err.count("\n") == 1


async def test_adapter_with_a_nan_weight_is_refused_before_anything_is_sent(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    weights = bytearray((adapter / WEIGHTS).read_bytes())
    weights[-4:] = struct.pack("<f", float("nan"))  # the last value of the last tensor
    (adapter / WEIGHTS).write_bytes(bytes(weights))
    result = await ctl("push", "alpha", str(adapter), env=_env(store_server))
    assert result.code == EXIT_USAGE
    assert f"{adapter}: the store would refuse it: {WEIGHTS}: tensor " in result.err
    assert "holds NaN at element 63 (shape [16, 4]); LoRA weights must be finite" in result.err
    listed = await ctl("list", "--json", env=_env(store_server))
    assert json.loads(listed.out).get("adapters", []) == []


async def test_adapter_with_an_absurd_scale_is_refused_before_anything_is_sent(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["lora_alpha"] = 1e308
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    result = await ctl("push", "alpha", str(adapter), env=_env(store_server))
    assert result.code == EXIT_USAGE
    assert "adapter_config.json: lora_alpha = 1e+308 with r = 4 gives a LoRA scale" in result.err
    listed = await ctl("list", "--json", env=_env(store_server))
    assert json.loads(listed.out).get("adapters", []) == []


async def test_watch_prints_events_after_seq(store_server: RunningStore, tmp_path: Path) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path / "a"))
    console = buffers()
    task = asyncio.create_task(run(["watch", "--after", "0"], _env(store_server), console))
    try:
        await eventually(lambda: "pushed alpha@1" in output(console.stdout), "the first event")
        await ctl("rollback", "alpha", "1", env=_env(store_server))
        await _push(store_server, "alpha", write_adapter_dir(tmp_path / "b", seed=1))
        await eventually(lambda: "pushed alpha@2" in output(console.stdout), "the push event")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    lines = output(console.stdout).splitlines()
    assert lines[0].startswith("seq=1 ")
    assert lines[-1].startswith("seq=2 ")


async def test_status_shows_each_replicas_serving_revision_and_error(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path))
    async with grpc.aio.insecure_channel(store_server.address) as channel:
        stub = pb_grpc.AdapterStoreServiceStub(channel)
        reason = "rank 64 exceeds max_lora_rank 16"
        await stub.ReportReplicaStatus(report_request("replica-a", {"alpha": refused(1, reason)}))
    result = await ctl("status", "alpha", env=_env(store_server))
    assert result.code == 0, result.err
    [row] = result.out.splitlines()[1:]
    assert row.startswith("alpha")
    assert "replica-a" in row
    assert "live" in row
    assert "1 FAILED" in row
    assert "@1 FAILED_PRECONDITION: rank 64 exceeds max_lora_rank 16" in row
    data = json.loads((await ctl("status", "alpha", "--json", env=_env(store_server))).out)
    assert data["statuses"][0]["type"] == "REPORT_TYPE_NACK"


async def test_push_without_a_writer_token_exits_4(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    security = ServerSecurity(
        reader_tokens=parse_tokens("r-token", "reader"),
        writer_tokens=parse_tokens("ci:w-token", "writer"),
    )
    adapter = write_adapter_dir(tmp_path)
    async with running_store(s3_bucket, security) as store:
        denied = await ctl(
            "push", "alpha", str(adapter), env={**_env(store), "ADAPTERCTL_TOKEN": "r-token"}
        )
        allowed = await ctl(
            "push", "alpha", str(adapter), env={**_env(store), "ADAPTERCTL_TOKEN": "w-token"}
        )
        revisions = await ctl(
            "revisions", "alpha", "--json", env={**_env(store), "ADAPTERCTL_TOKEN": "r-token"}
        )
    assert denied.code == EXIT_NOT_ALLOWED
    assert denied.err.startswith("adapterctl: error: PERMISSION_DENIED: ")
    assert allowed.out == "alpha@1\n"
    assert json.loads(revisions.out)["revisions"][0]["pushed_by"] == "ci"


async def test_watch_with_timeout_replays_the_log_and_exits_zero(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path))
    await ctl("delete", "alpha", "--yes", env=_env(store_server))
    result = await ctl("watch", "--after", "0", "--timeout", "1", "--json", env=_env(store_server))
    assert result.code == 0, result.err
    events = [json.loads(line) for line in result.out.splitlines()]
    assert [(e["seq"], e["type"]) for e in events] == [
        (1, "EVENT_TYPE_REVISION_PUSHED"),
        (2, "EVENT_TYPE_ADAPTER_DELETED"),
    ]


async def test_status_shows_every_page_of_statuses(
    store_server: RunningStore, tmp_path: Path
) -> None:
    await _push(store_server, "alpha", write_adapter_dir(tmp_path))
    assert PAGED_REPLICAS > 2 * DEFAULT_PAGE_SIZE
    write_statuses(store_server.bucket, "alpha", replicas=PAGED_REPLICAS)
    result = await ctl("status", "alpha", "--json", env=_env(store_server))
    table = await ctl("status", env=_env(store_server))
    assert (result.code, result.err, table.code, table.err) == (0, "", 0, "")
    statuses = json.loads(result.out)["statuses"]
    assert [s["replica_id"] for s in statuses] == [
        f"inference-{i:04d}" for i in range(PAGED_REPLICAS)
    ]
    assert len(table.out.splitlines()) == PAGED_REPLICAS + 1


async def test_push_of_a_deeply_nested_config_is_refused_naming_the_file(
    store_server: RunningStore, tmp_path: Path
) -> None:
    adapter = write_adapter_dir(tmp_path)
    (adapter / "adapter_config.json").write_bytes(nested_json(100_000))
    result = await ctl("push", "alpha", str(adapter), env=_env(store_server))
    assert result.code == EXIT_FAILED
    assert "INVALID_ARGUMENT: adapter_config.json: JSON nested more than 64" in result.err
