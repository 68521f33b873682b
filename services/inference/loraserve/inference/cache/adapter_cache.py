"""The local adapter cache: verified revisions on disk, at `<root>/<name>/<revision>/`.

Invariants: the engine never sees a partial or corrupt revision (downloads land in a
private directory under `.tmp/`, every file is checked against the manifest's size and
SHA-256, then the directory is renamed into place); an incompatible revision costs no
download (its manifest is checked first); the disk never holds more than the bound
(`bound`); this class alone creates and deletes revision directories. Why, and how it
fits the tiers: docs/design.md ("Residency is a hierarchy", "The disk is bounded").
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loraserve.common.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.common.revisions.names import validate_adapter_name
from loraserve.common.tracing import child_span, tracer
from loraserve.inference.cache import files
from loraserve.inference.cache.bound import ByteBound
from loraserve.inference.cache.download import check_manifest, same_files
from loraserve.inference.cache.fetching import (
    DownloadSource,
    Fetcher,
    FetchSettings,
    describe_download,
)
from loraserve.inference.cache.index import CacheIndex

log = logging.getLogger(__name__)
_TRACER = tracer(__name__)


@dataclass(frozen=True)
class CachedRevision:
    """A revision verified in the cache: its manifest and its directory
    (`<root>/<name>/<revision>/`)."""

    manifest: Revision
    path: Path
    # Whether this fetch downloaded it (a disk miss) rather than found it on disk.
    downloaded: bool = False

    @property
    def name(self) -> str:
        return self.manifest.adapter_name

    @property
    def revision(self) -> int:
        return self.manifest.revision

    @property
    def rank(self) -> int:
        return self.manifest.rank

    @property
    def base_model(self) -> str:
        return self.manifest.base_model

    @property
    def target_modules(self) -> tuple[str, ...]:
        return self.manifest.target_modules


class RevisionSource(DownloadSource, Protocol):
    """Where revisions come from: the store client, or a fake in tests."""

    async def get_revision(self, name: str, revision: int) -> Revision:
        """The revision's manifest; raises NotFound once it is deleted."""
        ...


ManifestCheck = Callable[[Revision], None]
"""Raises FailedPrecondition if a revision cannot be served here, judged from its manifest
(`CompatibilityChecker.check_manifest`)."""


class Holder(Protocol):
    """Who may be using revisions' files (the registry): asked to let go of one before
    the cache evicts it to make room."""

    async def release(self, name: str, revision: int) -> bool:
        """True once nothing uses the revision's files; False while it is in use,
        pinned or loading (then it stays)."""
        ...


class CacheObserver(Protocol):
    """Counts what the disk tier does (`InferenceMetrics`)."""

    def adapter_downloaded(self, path: str) -> None:
        """A revision was downloaded, `direct` from object storage or by `stream`."""

    def adapter_evicted(self, tier: str) -> None: ...


@dataclass(frozen=True)
class CacheUsage:
    """The disk tier now: bytes and revisions held, the bound, and what it did."""

    bytes: int
    capacity_bytes: int | None
    revisions: int
    downloads: int
    evictions: int


class _KeyLock:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class AdapterCache:
    """Fetches revisions from a source into verified directories under `root`;
    concurrent fetches of one revision share a single download."""

    def __init__(
        self,
        root: Path,
        source: RevisionSource,
        check: ManifestCheck | None = None,
        *,
        max_bytes: int | None = None,
        observer: CacheObserver | None = None,
        persist_interval_s: float = 2.0,
        room_wait_s: float = 30.0,
        fetch: FetchSettings | None = None,
    ) -> None:
        self._root = root.absolute()
        self._source = source
        self._check = check
        self._observer = observer
        self._locks: dict[RevisionKey, _KeyLock] = {}
        self._index = CacheIndex(self._root, persist_interval_s)
        self._bound = ByteBound(self._index, max_bytes, room_wait_s)
        self._fetcher = Fetcher(source, fetch or FetchSettings())
        self._downloads = 0
        self._evictions = 0

    @property
    def root(self) -> Path:
        return self._root

    async def prepare(self) -> None:
        """Creates the cache directory, removes downloads a crash left half-done, and
        indexes the revisions an earlier run left, in their saved order of use."""
        await asyncio.to_thread(self._prepare)
        # The bound may have shrunk since the last run; nothing holds a revision yet.
        await self._bound.trim(lambda key: self._evict(key, None))
        log.info(
            "cache.indexed revisions=%d bytes=%d bound=%s",
            len(self._index),
            self._index.disk_bytes,
            self._bound.max_bytes,
        )

    def _prepare(self) -> None:
        files.make_private_dir(self._root)
        shutil.rmtree(self._root / files.TEMP_DIR, ignore_errors=True)
        (self._root / files.TEMP_DIR).mkdir(files.PRIVATE)
        self._index.rebuild(files.revisions_on_disk(self._root))

    async def close(self) -> None:
        """Writes the index now and closes the connections to object storage (shutdown)."""
        await self._index.close()
        await self._fetcher.close()

    def usage(self) -> CacheUsage:
        return CacheUsage(
            self._index.disk_bytes,
            self._bound.max_bytes,
            len(self._index),
            self._downloads,
            self._evictions,
        )

    def recent_names(self) -> list[str]:
        """Adapters with a revision on disk, the most recently used first."""
        return self._index.recent_names()

    def is_cached(self, name: str, revision: int) -> bool:
        return (name, revision) in self._index

    def touch(self, name: str, revision: int) -> None:
        """The revision served a request: the last to be evicted."""
        self._index.touch(RevisionKey(name, revision))
        self._index.save_soon()

    @property
    def waiting_for_room(self) -> int:
        """Downloads waiting, first come first served, for the bound to have room."""
        return self._bound.waiting

    def hold_ended(self) -> None:
        """A holder stopped needing a revision: downloads waiting for room look again."""
        self._bound.changed()

    def path_of(self, name: str, revision: int) -> Path:
        """Where a revision lives; refuses anything that would leave the cache."""
        validate_adapter_name(name)
        if revision < 1:
            raise InvalidArgument(f"invalid revision {revision} of {name!r}: must be at least 1")
        path = (self._root / name / str(revision)).resolve()
        if not path.is_relative_to(self._root.resolve()):
            raise InvalidArgument(f"adapter path {path} is outside the cache {self._root}")
        return path

    async def fetch(
        self,
        name: str,
        revision: int,
        manifest: Revision | None = None,
        *,
        holder: Holder | None = None,
    ) -> CachedRevision:
        """A verified local copy of the revision, downloading it if needed.

        `manifest` is what the store said of the revision (a watch event, a listing);
        without one (a pinned request) the store is asked. To make room, `holder` is
        asked to let go of least recently used revisions. Raises NotFound for an
        unknown revision, FailedPrecondition for one this server cannot serve,
        DataLoss when the bytes do not match the manifest twice in a row,
        ResourceExhausted when no room freed in time, Unavailable when the store is
        down.
        """
        final = self.path_of(name, revision)
        key = RevisionKey(name, revision)
        async with self._exclusive(name, revision):
            try:
                manifest = await self._servable(name, revision, manifest)
            except (NotFound, FailedPrecondition):
                await self._delete(key, final)
                raise
            cached = await self._on_disk(key, final)
            if cached is not None:
                if same_files(cached, manifest):
                    log.info("cache.reused name=%s rev=%d", name, revision)
                    self.touch(name, revision)
                    return CachedRevision(cached, final)
                log.warning(
                    "cache.stale name=%s rev=%d: files differ from the store", name, revision
                )
                await self._delete(key, final)
            size = files.revision_bytes(manifest)
            await self._bound.reserve(key, size, lambda victim: self._evict(victim, holder))
            try:
                try:
                    downloaded = await self._download(manifest, final)
                except DataLoss as exc:
                    # A corrupted transfer is worth one more try; corrupt storage is not.
                    log.warning(
                        "cache.retry_download name=%s rev=%d reason=%s", name, revision, exc
                    )
                    downloaded = await self._download(manifest, final)
                self._index.add(key, size)
                self._index.save_soon()
            finally:
                self._bound.release(size)
            return downloaded

    async def _on_disk(self, key: RevisionKey, final: Path) -> Revision | None:
        """The manifest of a complete, intact copy on disk (every file hashed: the
        engine will read these bytes), or None."""
        with child_span(_TRACER, "loraserve.replica.verify") as span:
            manifest = await asyncio.to_thread(files.load_verified, final, *key)
            if span.is_recording():
                span.set_attributes(
                    {"loraserve.check": "sha256", "loraserve.found": manifest is not None}
                )
        if manifest is None:
            self._forget(key)
        elif key not in self._index:
            self._index.add(key, files.revision_bytes(manifest))
        return manifest

    async def _evict(self, key: RevisionKey, holder: Holder | None) -> bool:
        """Deletes a revision nothing holds, to make room; False if it stays."""
        if key in self._locks:
            return False
        async with self._exclusive(*key):
            if key not in self._index:
                return False
            if holder is not None and not await holder.release(*key):
                return False
            await self._delete(key, self.path_of(*key))
        self._evictions += 1
        if self._observer is not None:
            self._observer.adapter_evicted("disk")
        log.info("cache.evicted name=%s rev=%d bytes_now=%d", *key, self._index.disk_bytes)
        return True

    async def _delete(self, key: RevisionKey, path: Path) -> None:
        await asyncio.to_thread(files.remove_revision_dir, path)
        self._forget(key)
        self._bound.changed()

    def _forget(self, key: RevisionKey) -> None:
        if key in self._index:
            self._index.discard(key)
            self._index.save_soon()

    async def _servable(self, name: str, revision: int, manifest: Revision | None) -> Revision:
        """The revision's manifest, checked before any byte is downloaded. Asked of the
        store only when none was given: the store then also decides whether the
        revision may still be served (a deleted adapter must not live on from a
        local copy)."""
        if manifest is None:
            manifest = await self._source.get_revision(name, revision)
        check_manifest(manifest, name, revision)
        if self._check is not None:
            self._check(manifest)
        return manifest

    async def remove(self, name: str, revision: int) -> None:
        """Deletes a revision's files (and the adapter's directory once it is empty):
        the registry's call once the engine no longer reads them."""
        path = self.path_of(name, revision)
        async with self._exclusive(name, revision):
            await self._delete(RevisionKey(name, revision), path)
        log.info("cache.removed name=%s rev=%d", name, revision)

    async def remove_unused(self, name: str, in_use: Callable[[str, int], bool]) -> None:
        """Deletes the adapter's revisions on disk that `in_use` rejects and no fetch
        is using: files of a deleted adapter or of a superseded revision that the
        engine does not hold."""
        for revision in self._index.revisions_of(name):
            if not in_use(name, revision) and (name, revision) not in self._locks:
                await self.remove(name, revision)

    async def sweep(self, keep: Callable[[str, int], bool]) -> None:
        """Removes every revision directory that `keep` rejects and no fetch is using:
        what an earlier run left behind. Only `<adapter name>/<number>` entries are
        touched, so a cache pointed at a shared directory loses nothing else."""
        try:
            removed = await asyncio.to_thread(
                files.sweep, self._root, lambda *key: keep(*key) or key in self._locks
            )
        except OSError as exc:
            # Leftovers cost disk, not correctness: serving must not wait on them.
            log.warning("cache.sweep_failed reason=%s", exc)
            return
        for path in removed:
            self._forget(RevisionKey(path.parent.name, int(path.name)))
        log.info("cache.swept removed=%d", len(removed))

    @asynccontextmanager
    async def _exclusive(self, name: str, revision: int) -> AsyncIterator[None]:
        """One download or removal of a revision at a time; later callers wait and
        then find the result on disk."""
        key = RevisionKey(name, revision)
        entry = self._locks.setdefault(key, _KeyLock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[key]

    async def _download(self, expected: Revision, final: Path) -> CachedRevision:
        name, revision = expected.adapter_name, expected.revision
        staging = self._root / files.TEMP_DIR / f"{name}-{revision}-{uuid.uuid4().hex}"
        await asyncio.to_thread(staging.mkdir, files.PRIVATE, parents=True)
        try:
            with child_span(_TRACER, "loraserve.replica.download") as span:
                manifest, path = await self._fetcher.fetch(expected, staging)
                await asyncio.to_thread(files.commit, staging, final, manifest)
                describe_download(span, manifest, path)
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        self._downloads += 1
        if self._observer is not None:
            self._observer.adapter_downloaded(path)
        log.info(
            "cache.downloaded name=%s rev=%d files=%d bytes=%d path=%s",
            name,
            revision,
            len(manifest.files),
            sum(f.size for f in manifest.files),
            path,
        )
        return CachedRevision(manifest, final, downloaded=True)
