"""`push --watch` logic on real files and real file-system events, with the store
replaced by a list: what gets published, and when."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loraserve.adapterctl.adapter_dir import AdapterFiles, hash_files, list_adapter_dir
from loraserve.adapterctl.commands.watch_dir import ChangeSignal, Fingerprint, watch_directory
from loraserve.adapterctl.failures import UsageError
from loraserve.adapterctl.terminal.console import Console
from loraserve.testing.adapters.ctl import buffers, output, write_adapter_dir
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.waiting import eventually

WEIGHTS = "adapter_model.safetensors"
SETTLE_S = 0.2


class ListPublisher:
    """Records what would have been published, with the bytes as they were then."""

    def __init__(self, current: tuple[str, Fingerprint] | None = None) -> None:
        self.current = current
        self.published: list[dict[str, bytes]] = []

    async def last_published(self) -> tuple[str, Fingerprint] | None:
        return self.current

    async def publish(self, files: AdapterFiles) -> str:
        self.published.append({f.name: f.path.read_bytes() for f in files.files})
        return f"alpha@{len(self.published)}"


@contextlib.asynccontextmanager
async def watching(directory: Path, publisher: ListPublisher) -> AsyncIterator[Console]:
    console = buffers()
    task = asyncio.create_task(watch_directory("alpha", directory, publisher, console, SETTLE_S))
    try:
        yield console
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _count(console: Console, text: str) -> int:
    return output(console.stderr).count(text)


async def test_directory_is_published_once_at_start(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path)
    publisher = ListPublisher()
    async with watching(tmp_path, publisher) as console:
        await eventually(lambda: len(publisher.published) == 1, "the first publish")
    assert output(console.stdout) == "alpha@1\n"


async def test_half_written_weights_are_never_published(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path, seed=0)
    new_weights = tiny_adapter(seed=1)[WEIGHTS]
    publisher = ListPublisher()
    async with watching(tmp_path, publisher) as console:
        await eventually(lambda: len(publisher.published) == 1, "the first publish")
        with (tmp_path / WEIGHTS).open("wb") as f:
            f.write(new_weights[: len(new_weights) // 2])
        # The half-written file has settled, been looked at and been refused.
        await eventually(lambda: _count(console, "not pushing alpha") == 1, "the refusal")
        with (tmp_path / WEIGHTS).open("ab") as f:
            f.write(new_weights[len(new_weights) // 2 :])
        await eventually(lambda: len(publisher.published) == 2, "the second publish")
    assert publisher.published[1][WEIGHTS] == new_weights
    assert output(console.stdout) == "alpha@1\nalpha@2\n"


async def test_a_burst_of_writes_publishes_one_revision(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path, seed=0)
    new_weights = tiny_adapter(seed=2)[WEIGHTS]
    publisher = ListPublisher()
    async with watching(tmp_path, publisher):
        await eventually(lambda: len(publisher.published) == 1, "the first publish")
        with (tmp_path / WEIGHTS).open("wb") as f:
            for start in range(0, len(new_weights), 256):
                f.write(new_weights[start : start + 256])
                f.flush()
        await eventually(lambda: len(publisher.published) == 2, "the second publish")
    assert publisher.published[1][WEIGHTS] == new_weights


async def test_rewriting_identical_content_publishes_nothing(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path, seed=0)
    publisher = ListPublisher()
    async with watching(tmp_path, publisher) as console:
        await eventually(lambda: len(publisher.published) == 1, "the first publish")
        write_adapter_dir(tmp_path, seed=0)
        await eventually(lambda: _count(console, "unchanged since alpha@1") == 1, "the skip")
    assert len(publisher.published) == 1


async def test_content_already_current_in_the_store_is_not_republished(tmp_path: Path) -> None:
    write_adapter_dir(tmp_path / "first", seed=0)
    current = hash_files(list_adapter_dir(tmp_path / "first")).fingerprint()
    publisher = ListPublisher(current=("alpha@7", current))
    async with watching(tmp_path / "first", publisher) as console:
        await eventually(lambda: _count(console, "unchanged since alpha@7") == 1, "the skip")
    assert publisher.published == []


async def test_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such directory"):
        await watch_directory("alpha", tmp_path / "nope", ListPublisher(), buffers(), SETTLE_S)


async def test_ctrl_c_landing_with_a_change_during_settle_still_stops_the_watch() -> None:
    changes = ChangeSignal(asyncio.get_running_loop())
    settling = asyncio.create_task(changes.settled(60))
    await asyncio.sleep(0)  # settling waits for quiet
    changes.bump()  # a change arrives...
    await asyncio.sleep(0)  # ...its wake-up is under way...
    settling.cancel()  # ...as Ctrl-C cancels the watch.
    await asyncio.wait({settling}, timeout=30)
    try:
        assert settling.cancelled(), "the cancel was lost: the watch goes on"
    finally:
        settling.cancel()
