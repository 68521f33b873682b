"""The local adapter cache: verified downloads, atomic placement, reuse, refusal."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from loraserve.clients.downloads import FileChunk
from loraserve.clients.store import StoreClient, StoreClientSettings
from loraserve.common.errors import (
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from loraserve.common.revisions.manifest import Revision
from loraserve.common.rpc.security import ClientSecurity
from loraserve.inference.cache import AdapterCache
from loraserve.inference.cache.download import MANIFEST_FILE
from loraserve.testing.adapters.files import tiny_adapter
from loraserve.testing.fakes.revisions import FakeSource, file_info
from loraserve.testing.store.calls import push, store_stub
from loraserve.testing.store.server import RunningStore
from loraserve.testing.waiting import eventually

CONFIG = b'{"r": 8}'
WEIGHTS = bytes(range(256)) * 40


@pytest.fixture
def source() -> FakeSource:
    source = FakeSource()
    source.add("alpha", 1, {"adapter_config.json": CONFIG, "adapter_model.safetensors": WEIGHTS})
    return source


@pytest.fixture
async def cache(tmp_path: Path, source: FakeSource) -> AdapterCache:
    cache = AdapterCache(tmp_path / "cache", source)
    await cache.prepare()
    return cache


def leftovers(cache: AdapterCache) -> list[Path]:
    return list((cache.root / ".tmp").iterdir())


async def test_fetch_places_verified_files_at_name_and_revision(cache: AdapterCache) -> None:
    local = await cache.fetch("alpha", 1)
    assert local.path == cache.root / "alpha" / "1"
    assert (local.path / "adapter_model.safetensors").read_bytes() == WEIGHTS
    assert (local.path / "adapter_config.json").read_bytes() == CONFIG
    assert (local.rank, local.base_model, local.target_modules) == (8, "tiny", ("q_proj", "v_proj"))
    assert leftovers(cache) == []


async def test_corrupt_download_is_retried_once(cache: AdapterCache, source: FakeSource) -> None:
    source.corrupt_downloads = 1
    local = await cache.fetch("alpha", 1)
    assert source.downloads == 2
    assert (local.path / "adapter_model.safetensors").read_bytes() == WEIGHTS


async def test_corrupt_twice_raises_data_loss_and_leaves_nothing(
    cache: AdapterCache, source: FakeSource
) -> None:
    source.corrupt_downloads = 2
    with pytest.raises(DataLoss, match="sha256"):
        await cache.fetch("alpha", 1)
    assert not (cache.root / "alpha" / "1").exists()
    assert leftovers(cache) == []


async def test_file_longer_than_its_manifest_is_data_loss(
    cache: AdapterCache, source: FakeSource
) -> None:
    source.add("beta", 1, {"adapter_config.json": CONFIG})
    source.revisions[("beta", 1)] = {"adapter_config.json": CONFIG + b"extra"}
    with pytest.raises(DataLoss, match="more than the manifest"):
        await cache.fetch("beta", 1)
    assert not (cache.root / "beta").exists()


async def test_verified_copy_on_disk_is_reused_without_downloading(
    tmp_path: Path, source: FakeSource
) -> None:
    first = AdapterCache(tmp_path / "cache", source)
    await first.prepare()
    await first.fetch("alpha", 1)
    restarted = AdapterCache(tmp_path / "cache", source)
    await restarted.prepare()
    await restarted.fetch("alpha", 1)
    assert source.downloads == 1


async def test_tampered_copy_on_disk_is_downloaded_again(
    cache: AdapterCache, source: FakeSource
) -> None:
    local = await cache.fetch("alpha", 1)
    (local.path / "adapter_model.safetensors").write_bytes(b"tampered")
    await cache.fetch("alpha", 1)
    assert source.downloads == 2
    assert (local.path / "adapter_model.safetensors").read_bytes() == WEIGHTS


async def test_copy_of_a_deleted_revision_is_refused_and_removed(
    cache: AdapterCache, source: FakeSource
) -> None:
    local = await cache.fetch("alpha", 1)
    del source.manifests[("alpha", 1)]
    with pytest.raises(NotFound):
        await cache.fetch("alpha", 1)
    assert not local.path.exists()


async def test_concurrent_fetches_of_one_revision_share_one_download(
    cache: AdapterCache, source: FakeSource
) -> None:
    source.hold = asyncio.Event()
    fetches = [asyncio.create_task(cache.fetch("alpha", 1)) for _ in range(3)]
    await eventually(lambda: source.holding == 1, "the download in progress")
    source.hold.set()
    results = await asyncio.gather(*fetches)
    assert source.downloads == 1
    assert {r.path for r in results} == {cache.root / "alpha" / "1"}


async def test_store_unavailable_propagates_and_leaves_nothing(tmp_path: Path) -> None:
    class DownSource(FakeSource):
        async def download(
            self, name: str, revision: int
        ) -> AsyncGenerator[Revision | FileChunk, None]:
            raise Unavailable("store down")
            yield  # pragma: no cover - makes this an async generator

    source = DownSource()
    source.add("alpha", 1, {"adapter_config.json": CONFIG})
    cache = AdapterCache(tmp_path / "cache", source)
    await cache.prepare()
    with pytest.raises(Unavailable):
        await cache.fetch("alpha", 1)
    assert leftovers(cache) == []


@pytest.mark.parametrize("bad_name", ["../etc", "Alpha", "a/b", "", ".hidden"])
async def test_names_that_could_leave_the_cache_are_refused(
    cache: AdapterCache, bad_name: str
) -> None:
    with pytest.raises(InvalidArgument):
        await cache.fetch(bad_name, 1)


async def test_revision_below_one_is_refused(cache: AdapterCache) -> None:
    with pytest.raises(InvalidArgument, match="at least 1"):
        await cache.fetch("alpha", 0)


@pytest.mark.parametrize("bad_file", ["../escape", ".manifest.json", "sub/file", ".."])
async def test_manifest_file_names_that_are_paths_are_refused(
    cache: AdapterCache, source: FakeSource, bad_file: str
) -> None:
    source.add("gamma", 1, {bad_file: CONFIG})
    with pytest.raises(DataLoss, match="bad file name"):
        await cache.fetch("gamma", 1)
    assert not (cache.root / "escape").exists()
    assert not (cache.root / "gamma").exists()


async def test_empty_files_are_written_though_no_chunk_carries_them(
    cache: AdapterCache, source: FakeSource
) -> None:
    source.add("delta", 1, {"README.md": b"", "adapter_config.json": CONFIG})
    local = await cache.fetch("delta", 1)
    assert (local.path / "README.md").read_bytes() == b""


async def test_remove_deletes_the_revision_and_its_empty_adapter_dir(
    cache: AdapterCache,
) -> None:
    await cache.fetch("alpha", 1)
    await cache.remove("alpha", 1)
    assert not (cache.root / "alpha").exists()


async def test_prepare_removes_downloads_a_crash_left_behind(
    tmp_path: Path, source: FakeSource
) -> None:
    half = tmp_path / "cache" / ".tmp" / "alpha-1-dead"
    half.mkdir(parents=True)
    (half / "adapter_model.safetensors").write_bytes(b"partial")
    cache = AdapterCache(tmp_path / "cache", source)
    await cache.prepare()
    assert leftovers(cache) == []


async def test_revision_dir_without_manifest_is_not_trusted(
    cache: AdapterCache, source: FakeSource
) -> None:
    partial = cache.root / "alpha" / "1"
    partial.mkdir(parents=True)
    (partial / "adapter_model.safetensors").write_bytes(b"partial")
    local = await cache.fetch("alpha", 1)
    assert source.downloads == 1
    assert (local.path / MANIFEST_FILE).is_file()


async def test_revision_incompatible_by_its_manifest_is_refused_before_downloading(
    tmp_path: Path, source: FakeSource
) -> None:
    def refuse_rank_8(manifest: Revision) -> None:
        if manifest.rank == 8:
            raise FailedPrecondition(
                f"adapter {manifest.adapter_name}@{manifest.revision} has rank 8"
            )

    cache = AdapterCache(tmp_path / "cache", source, check=refuse_rank_8)
    await cache.prepare()

    with pytest.raises(FailedPrecondition, match="rank 8"):
        await cache.fetch("alpha", 1)
    assert source.downloads == 0
    assert not (cache.root / "alpha").exists()


async def test_sweep_removes_revisions_not_kept_and_nothing_else(
    cache: AdapterCache, source: FakeSource
) -> None:
    await cache.fetch("alpha", 1)
    (cache.root / "alpha" / "2").mkdir()
    (cache.root / "beta" / "3").mkdir(parents=True)
    (cache.root / "not an adapter").mkdir()

    await cache.sweep(lambda name, revision: (name, revision) == ("alpha", 1))

    assert sorted(p.name for p in cache.root.iterdir()) == [".tmp", "alpha", "not an adapter"]
    assert [p.name for p in (cache.root / "alpha").iterdir()] == ["1"]


async def test_fetch_with_the_stores_manifest_downloads_once_and_looks_nothing_up(
    cache: AdapterCache, source: FakeSource
) -> None:
    local = await cache.fetch("alpha", 1, source.manifests[("alpha", 1)])
    assert (source.downloads, source.lookups) == (1, 0)
    assert (local.path / "adapter_model.safetensors").read_bytes() == WEIGHTS


async def test_fetch_without_a_manifest_looks_it_up_once(
    cache: AdapterCache, source: FakeSource
) -> None:
    await cache.fetch("alpha", 1)
    assert (source.downloads, source.lookups) == (1, 1)


async def test_download_whose_manifest_differs_from_the_given_one_is_data_loss(
    cache: AdapterCache, source: FakeSource
) -> None:
    given = replace(
        source.manifests[("alpha", 1)], files=(file_info("adapter_config.json", CONFIG),)
    )
    with pytest.raises(DataLoss, match="other files"):
        await cache.fetch("alpha", 1, given)
    assert not (cache.root / "alpha").exists()
    assert leftovers(cache) == []


@pytest.fixture
async def store_cache(store_server: RunningStore, tmp_path: Path) -> AsyncIterator[AdapterCache]:
    """A cache filled from a real store (gRPC, S3 over moto HTTP) holding alpha@1."""
    async with store_stub(store_server.address) as stub:
        await push(stub, "alpha", tiny_adapter())
    settings = StoreClientSettings(store_server.address, ClientSecurity(), "cache-test-replica")
    client = StoreClient.connect(settings)
    cache = AdapterCache(tmp_path / "cache", client)
    await cache.prepare()
    try:
        yield cache
    finally:
        await cache.close()
        await client.close()


# What vLLM's loader reads from a revision's directory besides the manifest's files,
# depending on its version and on what else is there.
@pytest.mark.parametrize("stray", ["new_embeddings.safetensors", "adapter_model.bin"])
async def test_a_file_added_to_a_cached_revision_is_refused_and_the_revision_downloaded_again(
    store_cache: AdapterCache, stray: str
) -> None:
    first = await store_cache.fetch("alpha", 1)
    (first.path / stray).write_bytes(b"not what the store holds")
    again = await store_cache.fetch("alpha", 1)
    assert again.downloaded
    assert store_cache.usage().downloads == 2
    assert sorted(os.listdir(again.path)) == sorted(
        [MANIFEST_FILE, *(f.name for f in again.manifest.files)]
    )


async def test_a_directory_added_to_a_cached_revision_is_refused(
    cache: AdapterCache, source: FakeSource
) -> None:
    local = await cache.fetch("alpha", 1)
    (local.path / "checkpoint").mkdir()
    await cache.fetch("alpha", 1)
    assert source.downloads == 2
    assert not (local.path / "checkpoint").exists()


async def test_cache_directories_are_the_replicas_alone(store_cache: AdapterCache) -> None:
    local = await store_cache.fetch("alpha", 1)
    for directory in (store_cache.root, store_cache.root / ".tmp", local.path.parent, local.path):
        assert directory.stat().st_mode & 0o777 == 0o700, directory


async def test_an_existing_cache_directory_open_to_others_is_closed_to_them(
    tmp_path: Path, source: FakeSource
) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    await AdapterCache(root, source).prepare()
    assert root.stat().st_mode & 0o777 == 0o700
