"""`adapterctl yank` and `unyank` against a real store over gRPC and S3 (moto) (issue 54,
item 5): a round trip the store shows, and bad input refused with a clear message and
exit code, nothing committed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loraserve.adapterctl.failures import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from loraserve.adapterstore.v1 import adapterstore_pb2 as pb
from loraserve.testing.adapters.ctl import CtlResult, ctl, write_adapter_dir
from loraserve.testing.s3.endpoint import S3Bucket
from loraserve.testing.store.calls import store_stub
from loraserve.testing.store.server import RunningStore, running_store


@pytest.fixture
async def store(s3_bucket: S3Bucket, tmp_path: Path) -> AsyncIterator[RunningStore]:
    """alpha@1, and alpha@2 current (seq 2)."""
    async with running_store(s3_bucket) as running:
        for seed in (1, 2):
            directory = write_adapter_dir(tmp_path / str(seed), seed=seed)
            pushed = await run(running, "push", "alpha", str(directory))
            assert pushed.code == EXIT_OK, pushed.err
        yield running


async def run(store: RunningStore, *argv: str) -> CtlResult:
    return await ctl(*argv, env={"ADAPTERSTORE_ADDR": store.address})


async def _yanked(store: RunningStore) -> list[tuple[int, str]]:
    async with store_stub(store.address) as stub:
        got = await stub.GetAdapter(pb.GetAdapterRequest(name="alpha"))
    return [(y.revision, y.reason) for y in got.adapter.yanked_revisions]


async def test_yank_then_unyank_round_trips_through_the_store(store: RunningStore) -> None:
    yanked = await run(store, "yank", "alpha@1", "--reason", "leaks the system prompt")
    shown = await _yanked(store)
    unyanked = await run(store, "unyank", "alpha@1")

    assert (yanked.code, unyanked.code) == (EXIT_OK, EXIT_OK), yanked.err + unyanked.err
    assert yanked.out == "yanked alpha@1 (seq 3): leaks the system prompt\n"
    assert shown == [(1, "leaks the system prompt")]
    assert unyanked.out == "unyanked alpha@1 (seq 4)\n"
    assert await _yanked(store) == []


async def test_revisions_marks_a_yanked_revision_with_who_and_why(store: RunningStore) -> None:
    await run(store, "yank", "alpha@1", "--reason", "leaks the system prompt")
    listed = await run(store, "revisions", "alpha")
    (row,) = [line for line in listed.out.splitlines() if line.startswith("1 ")]
    assert "1 yanked" in row
    assert "[yanked by anonymous: leaks the system prompt]" in row


BAD_COMMANDS = {
    "no revision": (("yank", "alpha", "--reason", "x"), EXIT_USAGE, "NAME@REV"),
    "no reason": (("yank", "alpha@1"), EXIT_USAGE, "--reason"),
    "blank reason": (("yank", "alpha@1", "--reason", " "), EXIT_USAGE, "--reason must say why"),
    "bad revision": (("unyank", "alpha@x"), EXIT_USAGE, "revision must be a positive integer"),
    "bad name": (("unyank", "Alpha@1"), EXIT_USAGE, "invalid adapter name"),
    "unknown revision": (("yank", "alpha@9", "--reason", "x"), EXIT_FAILED, "NOT_FOUND"),
    "the current revision": (
        ("yank", "alpha@2", "--reason", "x"),
        EXIT_FAILED,
        "FAILED_PRECONDITION: alpha@2 is the current revision",
    ),
}


@pytest.mark.parametrize(("argv", "code", "problem"), BAD_COMMANDS.values(), ids=BAD_COMMANDS)
async def test_a_bad_yank_command_exits_non_zero_naming_the_problem(
    store: RunningStore, argv: tuple[str, ...], code: int, problem: str
) -> None:
    result = await run(store, *argv)

    assert (result.code, result.out) == (code, "")
    assert problem in result.err
    assert store.store.head_seq == 2
