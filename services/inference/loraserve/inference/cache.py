"""The local adapter cache: verified revisions on disk, at `<root>/<name>/<revision>/`.

A revision is downloaded into a private temporary directory under the cache root,
every file is checked against the manifest's size and SHA-256, and only then is the
directory renamed into place, so the engine never sees a partial or corrupt
revision. The manifest is kept beside the files (`.manifest.json`) so a revision
found on disk after a restart is re-verified and reused without a download.

Sync passes the manifest its watch event or listing carried, so a load costs one
download stream and no lookup; the stream's own manifest must match it. Only a
pinned `name@revision` request, which has no event, looks the manifest up (once).
Before any byte is downloaded, the manifest (base model, rank, target modules) is
checked against what this server can serve, so an incompatible adapter costs no
download.

The cache alone creates and removes directories under its root: the registry hands
a revision back with `remove` once the engine let go of it, and `sweep` removes
revision directories nothing needs (an earlier run's leftovers), so the disk holds
only what is served or loading.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loraserve.clients.store import FileChunk
from loraserve.common.errors import DataLoss, FailedPrecondition, InvalidArgument, NotFound
from loraserve.common.manifest import Revision
from loraserve.common.names import validate_adapter_name
from loraserve.inference.compat import AdapterFacts
from loraserve.inference.download import MANIFEST_FILE, Receiver, check_manifest

log = logging.getLogger(__name__)

_TEMP_DIR = ".tmp"
_HASH_BLOCK = 1024 * 1024


@dataclass(frozen=True)
class CachedRevision:
    """A revision verified in the cache: its manifest and its directory
    (`<root>/<name>/<revision>/`)."""

    manifest: Revision
    path: Path

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


class RevisionSource(Protocol):
    """Where revisions come from: the store client, or a fake in tests."""

    async def get_revision(self, name: str, revision: int) -> Revision:
        """The revision's manifest; raises NotFound once it is deleted."""
        ...

    def download(self, name: str, revision: int) -> AsyncGenerator[Revision | FileChunk, None]:
        """The manifest first, then each file's chunks in manifest order."""


ManifestCheck = Callable[[AdapterFacts], None]
"""Raises FailedPrecondition if a revision cannot be served here (`CompatibilityChecker.check`)."""


class _KeyLock:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0


class AdapterCache:
    """Fetches revisions from a source into verified directories under `root`.

    The registry's `RevisionCache`. Concurrent fetches of one revision share a
    single download.
    """

    def __init__(
        self, root: Path, source: RevisionSource, check: ManifestCheck | None = None
    ) -> None:
        self._root = root.absolute()
        self._source = source
        self._check = check
        self._locks: dict[tuple[str, int], _KeyLock] = {}

    @property
    def root(self) -> Path:
        return self._root

    async def prepare(self) -> None:
        """Creates the cache directory and removes downloads a crash left half-done."""
        await asyncio.to_thread(self._prepare)

    def _prepare(self) -> None:
        self._root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self._root / _TEMP_DIR, ignore_errors=True)
        (self._root / _TEMP_DIR).mkdir()

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
        self, name: str, revision: int, manifest: Revision | None = None
    ) -> CachedRevision:
        """A verified local copy of the revision, downloading it if needed.

        `manifest` is what the store said of the revision (a watch event, a listing);
        without one (a pinned request) the store is asked. Raises NotFound for an
        unknown revision, FailedPrecondition for one this server cannot serve,
        DataLoss when the bytes do not match the manifest twice in a row,
        Unavailable when the store is down.
        """
        final = self.path_of(name, revision)
        async with self._exclusive(name, revision):
            try:
                manifest = await self._servable(name, revision, manifest)
            except (NotFound, FailedPrecondition):
                await asyncio.to_thread(_remove_revision_dir, final)
                raise
            cached = await asyncio.to_thread(_load_verified, final, name, revision)
            if cached is not None:
                if _same_files(cached, manifest):
                    log.info("cache.reused name=%s rev=%d", name, revision)
                    return CachedRevision(cached, final)
                log.warning(
                    "cache.stale name=%s rev=%d: files differ from the store", name, revision
                )
            try:
                return await self._download(manifest, final)
            except DataLoss as exc:
                # A corrupted transfer is worth one more try; corrupt storage is not.
                log.warning("cache.retry_download name=%s rev=%d reason=%s", name, revision, exc)
                return await self._download(manifest, final)

    async def _servable(self, name: str, revision: int, manifest: Revision | None) -> Revision:
        """The revision's manifest, checked before any byte is downloaded. Asked of the
        store only when none was given: the store then also decides whether the
        revision may still be served (a deleted adapter must not live on from a
        local copy)."""
        if manifest is None:
            manifest = await self._source.get_revision(name, revision)
        check_manifest(manifest, name, revision)
        if self._check is not None:
            self._check(manifest_facts(manifest))
        return manifest

    async def remove(self, name: str, revision: int) -> None:
        """Deletes a revision's files (and the adapter's directory once it is empty):
        the registry's call once the engine no longer reads them."""
        path = self.path_of(name, revision)
        async with self._exclusive(name, revision):
            await asyncio.to_thread(_remove_revision_dir, path)
        log.info("cache.removed name=%s rev=%d", name, revision)

    async def sweep(self, keep: Callable[[str, int], bool]) -> None:
        """Removes every revision directory that `keep` rejects and no fetch is using:
        what an earlier run left behind. Only `<adapter name>/<number>` entries are
        touched, so a cache pointed at a shared directory loses nothing else."""
        try:
            removed = await asyncio.to_thread(self._sweep, keep)
        except OSError as exc:
            # Leftovers cost disk, not correctness: serving must not wait on them.
            log.warning("cache.sweep_failed reason=%s", exc)
            return
        log.info("cache.swept removed=%d", len(removed))

    def _sweep(self, keep: Callable[[str, int], bool]) -> list[Path]:
        removed = []
        for adapter_dir in sorted(self._root.iterdir()):
            if not _is_adapter_dir(adapter_dir):
                continue
            for entry in sorted(adapter_dir.iterdir()):
                if not entry.name.isdigit():
                    continue
                key = (adapter_dir.name, int(entry.name))
                if keep(*key) or key in self._locks:
                    continue
                log.info("cache.stale_removed name=%s rev=%d", *key)
                _remove_path(entry)
                removed.append(entry)
            with contextlib.suppress(OSError):  # still holds kept revisions
                adapter_dir.rmdir()
        return removed

    @asynccontextmanager
    async def _exclusive(self, name: str, revision: int) -> AsyncIterator[None]:
        """One download or removal of a revision at a time; later callers wait and
        then find the result on disk."""
        key = (name, revision)
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
        staging = self._root / _TEMP_DIR / f"{name}-{revision}-{uuid.uuid4().hex}"
        await asyncio.to_thread(staging.mkdir, parents=True)
        try:
            manifest = await self._receive(expected, staging)
            await asyncio.to_thread(_commit, staging, final, manifest)
        finally:
            await asyncio.to_thread(shutil.rmtree, staging, True)
        log.info(
            "cache.downloaded name=%s rev=%d files=%d bytes=%d",
            name,
            revision,
            len(manifest.files),
            sum(f.size for f in manifest.files),
        )
        return CachedRevision(manifest, final)

    async def _receive(self, expected: Revision, staging: Path) -> Revision:
        name, revision = expected.adapter_name, expected.revision
        receiver = Receiver(name, revision, staging)
        try:
            async with aclosing(self._source.download(name, revision)) as stream:
                async for message in stream:
                    if isinstance(message, Revision):
                        if not _same_files(message, expected):
                            raise DataLoss(
                                f"download of {name}@{revision}: the stream's manifest lists "
                                "other files than the store's event or listing"
                            )
                        receiver.take_manifest(message)
                    else:
                        await receiver.take_chunk(message)
            return await receiver.finish()
        finally:
            await receiver.close()


def _same_files(a: Revision, b: Revision) -> bool:
    return sorted(a.files, key=lambda f: f.name) == sorted(b.files, key=lambda f: f.name)


def _commit(staging: Path, final: Path, manifest: Revision) -> None:
    (staging / MANIFEST_FILE).write_text(json.dumps(manifest.to_json()), "utf-8")
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        # Left by an earlier process and not verifiable: replace it.
        shutil.rmtree(final)
    os.rename(staging, final)
    _fsync_dir(final.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _load_verified(path: Path, name: str, revision: int) -> Revision | None:
    """The manifest of a complete, intact revision directory, or None (after
    removing the directory) if it is missing, partial or corrupt."""
    marker = path / MANIFEST_FILE
    if not marker.is_file():
        if path.exists():
            shutil.rmtree(path)
        return None
    try:
        manifest = Revision.from_json(json.loads(marker.read_text("utf-8")))
        check_manifest(manifest, name, revision)
        for file in manifest.files:
            if _sha256_of(path / file.name, file.size) != file.sha256:
                raise DataLoss(f"cached file {file.name!r} does not match its manifest")
        return manifest
    except (OSError, ValueError, KeyError, TypeError, DataLoss) as exc:
        log.warning("cache.discarded_corrupt name=%s rev=%d reason=%s", name, revision, exc)
        shutil.rmtree(path, ignore_errors=True)
        return None


def _sha256_of(path: Path, expected_size: int) -> str | None:
    if path.is_symlink() or not path.is_file() or path.stat().st_size != expected_size:
        return None
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _is_adapter_dir(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return False
    try:
        validate_adapter_name(path.name)
    except InvalidArgument:
        return False
    return True


def _remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove_revision_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # other revisions of the adapter remain
        path.parent.rmdir()


def manifest_facts(manifest: Revision) -> AdapterFacts:
    """What the compatibility checks need of a manifest."""
    return AdapterFacts(
        manifest.adapter_name,
        manifest.revision,
        manifest.rank,
        manifest.target_modules,
        manifest.base_model,
    )
