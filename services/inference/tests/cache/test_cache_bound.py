"""The disk tier: a byte bound kept by evicting least recently used revisions that
nothing holds, and an index of use that outlives a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from loraserve.common.errors import FailedPrecondition, ResourceExhausted
from loraserve.inference.cache import AdapterCache
from loraserve.inference.cache.index import INDEX_FILE
from loraserve.testing.fakes.revisions import FakeSource
from loraserve.testing.waiting import eventually

CONFIG = b'{"r": 8}'
WEIGHTS = bytes(range(256)) * 40
SIZE = len(CONFIG) + len(WEIGHTS)
NAMES = ("a", "b", "c", "d")


class Holder:
    """The registry's side of an eviction: lets go of whatever it does not hold."""

    def __init__(self) -> None:
        self.held: set[tuple[str, int]] = set()
        self.released: list[tuple[str, int]] = []

    async def release(self, name: str, revision: int) -> bool:
        if (name, revision) in self.held:
            return False
        self.released.append((name, revision))
        return True


@pytest.fixture
def source() -> FakeSource:
    source = FakeSource()
    for name in NAMES:
        # The weights first: the cache finishes (flushes) a file when the next begins, so
        # a download held after its last chunk has its weights whole on disk.
        source.add(name, 1, {"adapter_model.safetensors": WEIGHTS, "adapter_config.json": CONFIG})
    return source


async def bounded(
    root: Path, source: FakeSource, revisions: float, room_wait_s: float = 30.0
) -> AdapterCache:
    cache = AdapterCache(
        root,
        source,
        max_bytes=int(SIZE * revisions),
        persist_interval_s=0,
        room_wait_s=room_wait_s,
    )
    await cache.prepare()
    return cache


def bytes_on_disk(root: Path) -> int:
    """Everything the cache keeps, its manifests and index included; not downloads
    in progress."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".tmp" not in p.parts)


def bytes_taken(root: Path) -> int:
    """Every byte under the cache's root: what it keeps and the downloads in progress."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def on_disk(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}


async def test_download_evicts_the_least_recently_used_revision_to_stay_under_the_bound(
    tmp_path: Path, source: FakeSource
) -> None:
    cache = await bounded(tmp_path / "cache", source, 2.5)
    await cache.fetch("a", 1)
    await cache.fetch("b", 1)
    cache.touch("a", 1)

    await cache.fetch("c", 1)

    assert on_disk(cache.root) == {"a", "c"}
    await cache.close()
    assert bytes_on_disk(cache.root) <= cache.usage().bytes <= SIZE * 2.5
    assert cache.usage().evictions == 1


async def test_revision_its_holder_keeps_is_not_evicted(tmp_path: Path, source: FakeSource) -> None:
    holder = Holder()
    holder.held.add(("a", 1))
    cache = await bounded(tmp_path / "cache", source, 2.5)
    await cache.fetch("a", 1, holder=holder)
    await cache.fetch("b", 1, holder=holder)

    await cache.fetch("c", 1, holder=holder)

    assert on_disk(cache.root) == {"a", "c"}
    assert holder.released == [("b", 1)]


async def test_download_that_cannot_get_room_is_resource_exhausted_and_keeps_the_bound(
    tmp_path: Path, source: FakeSource
) -> None:
    holder = Holder()
    holder.held |= {("a", 1), ("b", 1)}
    cache = await bounded(tmp_path / "cache", source, 2.5, room_wait_s=0.1)
    await cache.fetch("a", 1, holder=holder)
    await cache.fetch("b", 1, holder=holder)

    with pytest.raises(ResourceExhausted, match="adapter cache full"):
        await cache.fetch("c", 1, holder=holder)

    assert on_disk(cache.root) == {"a", "b"}
    assert source.downloads == 2
    assert list((cache.root / ".tmp").iterdir()) == []


async def test_downloads_that_together_pass_the_bound_wait_for_room_and_all_land(
    tmp_path: Path, source: FakeSource
) -> None:
    cache = await bounded(tmp_path / "cache", source, 2.5)
    source.hold = asyncio.Event()
    fetches = [asyncio.create_task(cache.fetch(name, 1)) for name in ("a", "b", "c")]
    try:
        await eventually(lambda: source.holding >= 2, "two downloads on disk and not over")
        # Sampled on disk while two transfers are there and the third waits for room.
        peak = bytes_taken(cache.root)
        started = source.downloads
    finally:
        source.hold.set()

    fetched = await asyncio.gather(*fetches)

    assert [rev.name for rev in fetched] == ["a", "b", "c"]
    assert (started, source.downloads) == (2, 3)
    assert 2 * len(WEIGHTS) <= peak <= SIZE * 2.5
    await cache.close()
    assert bytes_on_disk(cache.root) <= SIZE * 2.5


async def test_download_waiting_for_room_goes_once_its_holder_lets_go(
    tmp_path: Path, source: FakeSource
) -> None:
    holder = Holder()
    holder.held |= {("a", 1), ("b", 1)}
    cache = await bounded(tmp_path / "cache", source, 2.5)
    await cache.fetch("a", 1, holder=holder)
    await cache.fetch("b", 1, holder=holder)
    waiting = asyncio.create_task(cache.fetch("c", 1, holder=holder))
    await asyncio.sleep(0)
    assert not waiting.done()

    holder.held.discard(("a", 1))
    cache.hold_ended()
    await waiting

    assert on_disk(cache.root) == {"b", "c"}
    assert holder.released == [("a", 1)]


async def test_downloads_waiting_for_room_go_first_come_first_served(
    tmp_path: Path, source: FakeSource
) -> None:
    holder = Holder()
    holder.held |= {("a", 1), ("b", 1)}
    cache = await bounded(tmp_path / "cache", source, 2.5)
    await cache.fetch("a", 1, holder=holder)
    await cache.fetch("b", 1, holder=holder)
    source.hold = asyncio.Event()
    first = asyncio.create_task(cache.fetch("c", 1, holder=holder))
    await eventually(lambda: cache.waiting_for_room == 1, "c waiting for room")
    second = asyncio.create_task(cache.fetch("d", 1, holder=holder))
    await eventually(lambda: cache.waiting_for_room == 2, "c and d waiting for room")

    holder.held.discard(("a", 1))  # room for one of them
    cache.hold_ended()
    await eventually(lambda: source.holding == 1, "one download in progress")

    assert (source.started[2:], cache.waiting_for_room) == (["c"], 1)
    holder.held.clear()
    cache.hold_ended()
    source.hold.set()
    await asyncio.gather(first, second)
    assert source.started[2:] == ["c", "d"]


async def test_room_that_never_frees_names_what_holds_the_bytes(
    tmp_path: Path, source: FakeSource
) -> None:
    cache = await bounded(tmp_path / "cache", source, 2.5, room_wait_s=0.1)
    source.hold = asyncio.Event()
    held = [asyncio.create_task(cache.fetch(name, 1)) for name in ("a", "b")]
    await eventually(lambda: source.holding == 2, "two downloads in progress")

    with pytest.raises(ResourceExhausted) as refused:
        await cache.fetch("c", 1)

    assert "reserved by 2 downloads in progress" in refused.value.message
    assert "c@1 needs" in refused.value.message
    source.hold.set()
    await asyncio.gather(*held)


async def test_revision_larger_than_the_bound_is_refused_before_downloading(
    tmp_path: Path, source: FakeSource
) -> None:
    cache = await bounded(tmp_path / "cache", source, 0.5)

    with pytest.raises(FailedPrecondition, match="--adapter-cache-size"):
        await cache.fetch("a", 1)

    assert source.downloads == 0


async def test_concurrent_downloads_stay_under_the_bound_while_they_transfer(
    tmp_path: Path, source: FakeSource
) -> None:
    cache = await bounded(tmp_path / "cache", source, 2.5)
    await cache.fetch("a", 1)
    source.hold = asyncio.Event()
    fetches = [asyncio.create_task(cache.fetch(name, 1)) for name in ("b", "c")]
    try:
        await eventually(lambda: source.holding == 2, "both downloads on disk and not over")
        during = bytes_taken(cache.root)
    finally:
        source.hold.set()
    await asyncio.gather(*fetches)

    # Both transfers were seen on disk, and with what the cache kept they fit the bound.
    assert 2 * len(WEIGHTS) <= during <= SIZE * 2.5
    assert on_disk(cache.root) == {"b", "c"}
    await cache.close()
    assert bytes_taken(cache.root) <= SIZE * 2.5


async def test_order_of_use_survives_a_restart(tmp_path: Path, source: FakeSource) -> None:
    first = await bounded(tmp_path / "cache", source, 10)
    for name in NAMES:
        await first.fetch(name, 1)
    first.touch("b", 1)
    first.touch("a", 1)
    await first.close()

    restarted = await bounded(tmp_path / "cache", source, 10)

    assert restarted.recent_names() == ["a", "b", "d", "c"]
    assert 4 * SIZE < bytes_on_disk(restarted.root) <= restarted.usage().bytes


async def test_a_smaller_bound_after_a_restart_evicts_the_least_recently_used(
    tmp_path: Path, source: FakeSource
) -> None:
    first = await bounded(tmp_path / "cache", source, 10)
    for name in NAMES:
        await first.fetch(name, 1)
    first.touch("a", 1)
    await first.close()

    restarted = await bounded(tmp_path / "cache", source, 2.5)

    assert on_disk(restarted.root) == {"d", "a"}
    await restarted.close()
    assert bytes_on_disk(restarted.root) <= SIZE * 2.5


async def test_unreadable_index_orders_by_what_is_on_disk(
    tmp_path: Path, source: FakeSource
) -> None:
    first = await bounded(tmp_path / "cache", source, 10)
    await first.fetch("a", 1)
    await first.close()
    (first.root / INDEX_FILE).write_text("{not json", "utf-8")

    restarted = await bounded(tmp_path / "cache", source, 10)
    await restarted.fetch("a", 1)

    assert restarted.recent_names() == ["a"]
    assert source.downloads == 1
