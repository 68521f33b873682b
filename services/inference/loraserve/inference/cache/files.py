"""The adapter cache's files: `<root>/<name>/<revision>/` holds a revision's files
and its manifest (`.manifest.json`, written last, so a directory without it is not
a complete revision); downloads land in `<root>/.tmp/` first and are renamed into
place. Every directory is the replica's alone (0700): vLLM loads whatever a revision
directory holds, so no one else may add to it. Blocking functions, run in a worker
thread by `AdapterCache`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from loraserve.common.errors import DataLoss, InvalidArgument
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.common.revisions.names import validate_adapter_name
from loraserve.inference.cache.download import MANIFEST_FILE, check_manifest

log = logging.getLogger(__name__)

TEMP_DIR = ".tmp"
HASH_BLOCK = 1024 * 1024
PRIVATE = 0o700


def make_private_dir(path: Path) -> None:
    """Creates `path` (and its parents) for this process's user alone; an existing
    one open to others is closed to them, since everything below it is loaded."""
    path.mkdir(PRIVATE, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        try:
            path.chmod(PRIVATE)
        except OSError as exc:
            # Revision directories below are still created private; say so and serve.
            log.warning("cache.not_private path=%s reason=%s", path, exc.strerror or exc)


def sweep(root: Path, keep: Callable[[str, int], bool]) -> list[Path]:
    """Removes every `<adapter name>/<number>` directory under `root` that `keep`
    rejects; returns what it removed."""
    removed = []
    for adapter_dir in sorted(root.iterdir()):
        if not is_adapter_dir(adapter_dir):
            continue
        for entry in sorted(adapter_dir.iterdir()):
            if not entry.name.isdigit():
                continue
            key = (adapter_dir.name, int(entry.name))
            if keep(*key):
                continue
            log.info("cache.stale_removed name=%s rev=%d", *key)
            remove_path(entry)
            removed.append(entry)
        with contextlib.suppress(OSError):  # still holds kept revisions
            adapter_dir.rmdir()
    return removed


def manifest_text(manifest: Revision) -> str:
    """What `commit` writes beside a revision's files (ASCII: one byte a character)."""
    return json.dumps(manifest.to_json())


def revision_bytes(manifest: Revision) -> int:
    """What a revision takes on disk: its files and the manifest kept beside them."""
    return sum(f.size for f in manifest.files) + len(manifest_text(manifest))


def commit(staging: Path, final: Path, manifest: Revision) -> None:
    (staging / MANIFEST_FILE).write_text(manifest_text(manifest), "utf-8")
    final.parent.mkdir(PRIVATE, exist_ok=True)
    if final.exists():
        # Left by an earlier process and not verifiable: replace it.
        shutil.rmtree(final)
    os.rename(staging, final)
    fsync_dir(final.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_verified(path: Path, name: str, revision: int) -> Revision | None:
    """The manifest of a complete, intact revision directory, or None (after
    removing the directory) if it is missing, partial or corrupt, or holds anything
    its manifest does not list (vLLM reads what it finds in the directory: its loader
    falls back to a pickled `adapter_model.bin`, older versions read `new_embeddings.*`)."""
    marker = path / MANIFEST_FILE
    if not marker.is_file():
        if path.exists():
            shutil.rmtree(path)
        return None
    try:
        manifest = Revision.from_json(json.loads(marker.read_text("utf-8")))
        check_manifest(manifest, name, revision)
        listed = {MANIFEST_FILE, *(file.name for file in manifest.files)}
        unexpected = sorted(set(os.listdir(path)) - listed)
        if unexpected:
            raise DataLoss(
                f"the revision directory holds {len(unexpected)} entries its manifest does "
                f"not list, e.g. {unexpected[:3]}"
            )
        for file in manifest.files:
            if sha256_of(path / file.name, file.size) != file.sha256:
                raise DataLoss(f"cached file {file.name!r} does not match its manifest")
        return manifest
    except (OSError, ValueError, KeyError, TypeError, DataLoss) as exc:
        log.warning("cache.discarded_corrupt name=%s rev=%d reason=%s", name, revision, exc)
        shutil.rmtree(path, ignore_errors=True)
        return None


def read_manifest(path: Path) -> Revision | None:
    try:
        return Revision.from_json(json.loads((path / MANIFEST_FILE).read_text("utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def revisions_on_disk(root: Path) -> list[tuple[RevisionKey, int]]:
    """Every complete revision directory under `root` with its manifest's bytes; the
    files themselves are hashed when the revision is next fetched."""
    found = []
    for adapter_dir in root.iterdir():
        if not is_adapter_dir(adapter_dir):
            continue
        for entry in adapter_dir.iterdir():
            if entry.name.isdigit():
                manifest = read_manifest(entry)
                if manifest is not None:
                    size = revision_bytes(manifest)
                    found.append((RevisionKey(adapter_dir.name, int(entry.name)), size))
    return found


def sha256_of(path: Path, expected_size: int) -> str | None:
    if path.is_symlink() or not path.is_file() or path.stat().st_size != expected_size:
        return None
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def is_adapter_dir(path: Path) -> bool:
    if not path.is_dir() or path.is_symlink():
        return False
    try:
        validate_adapter_name(path.name)
    except InvalidArgument:
        return False
    return True


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def remove_revision_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(OSError):  # other revisions of the adapter remain
        path.parent.rmdir()
