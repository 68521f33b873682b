"""Reading a local adapter directory: which files to publish, whether they are
complete, and their SHA-256 digests.

The file rules are the store's own (`loraserve.adapterstore.files.validation`), so what
adapterctl sends is what the store accepts; the store still checks everything. The
one read that hashes a file also runs the store's checks of its values (every weight
finite, the config's LoRA scale bounded: `loraserve.common.revisions.lora_values`), so a push
the store would refuse for them is never sent.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from loraserve.adapterctl.failures import UsageError
from loraserve.clients.push import CHUNK_SIZE, LocalFile
from loraserve.common.errors import InvalidArgument
from loraserve.common.revisions.lora_values import WeightsFileCheck, check_config_scale
from loraserve.common.revisions.peft_format import (
    ALLOWED_FILES,
    CONFIG_FILE,
    MAX_CONFIG_SIZE,
    PICKLE_SUFFIXES,
    REQUIRED_FILES,
    WEIGHTS_FILE,
    load_json_object,
    parse_safetensors_header,
    safetensors_header_length,
)


@dataclass(frozen=True)
class AdapterFiles:
    """What a push of a directory sends, files in the order they are streamed."""

    directory: Path
    files: tuple[LocalFile, ...]
    ignored: tuple[str, ...]  # files in the directory that are never uploaded

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)

    def fingerprint(self) -> tuple[tuple[str, int, str], ...]:
        """Content identity: equal fingerprints mean an identical revision."""
        return tuple(sorted((f.name, f.size, f.sha256) for f in self.files))


@dataclass(frozen=True)
class DirectoryListing:
    """The files of a directory before hashing: what to send and what to skip."""

    directory: Path
    selected: tuple[Path, ...]
    ignored: tuple[str, ...]


def list_adapter_dir(directory: Path) -> DirectoryListing:
    """Selects the files to publish; raises UsageError if the directory is unusable."""
    if not directory.exists():
        raise UsageError(f"{directory}: no such directory")
    if not directory.is_dir():
        raise UsageError(f"{directory}: not a directory")
    try:
        # is_file follows symlinks, as Hugging Face cache snapshots need.
        present = sorted(p for p in directory.iterdir() if p.is_file())
    except OSError as exc:
        raise UsageError(f"{directory}: cannot read directory: {exc.strerror}") from None
    names = {p.name for p in present}
    missing = sorted(REQUIRED_FILES - names)
    if missing:
        hint = ""
        if WEIGHTS_FILE in missing and any(n.endswith(PICKLE_SUFFIXES) for n in names):
            hint = (
                f"; pickle weights (.bin, .pt, ...) are never accepted, save the adapter "
                f"with safe_serialization=True to get {WEIGHTS_FILE}"
            )
        raise UsageError(f"{directory}: missing {', '.join(missing)}{hint}")
    # Required files first: the store checks them as they arrive and fails fast.
    selected = sorted(
        (p for p in present if p.name in ALLOWED_FILES),
        key=lambda p: (p.name not in REQUIRED_FILES, p.name != CONFIG_FILE, p.name),
    )
    # Hidden files (editor swap files, build markers) are skipped without a warning.
    ignored = tuple(
        p.name for p in present if p.name not in ALLOWED_FILES and not p.name.startswith(".")
    )
    return DirectoryListing(directory, tuple(selected), ignored)


def check_complete(listing: DirectoryListing) -> None:
    """Raises InvalidArgument unless the config parses and the safetensors file is
    exactly as long as its header says: a file still being written never passes."""
    config_path = listing.directory / CONFIG_FILE
    weights_path = listing.directory / WEIGHTS_FILE
    try:
        config_bytes = config_path.read_bytes()
    except OSError as exc:
        raise InvalidArgument(f"{CONFIG_FILE}: cannot read ({exc.strerror})") from None
    load_json_object(config_bytes, CONFIG_FILE)
    try:
        with weights_path.open("rb") as f:
            size = weights_path.stat().st_size
            prefix = f.read(8)
            length = safetensors_header_length(prefix, size)
            header = f.read(length)
    except OSError as exc:
        raise InvalidArgument(f"{WEIGHTS_FILE}: cannot read ({exc.strerror})") from None
    if len(header) != length:
        raise InvalidArgument(f"{WEIGHTS_FILE}: header is cut short")
    parse_safetensors_header(header, size)


class FileReading:
    """One read of a file, chunk by chunk: its SHA-256 and, for the config and the
    weights, the store's checks of their values. `finish` raises UsageError naming
    the file and the problem."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = 0
        self._digest = hashlib.sha256()
        self._weights = WeightsFileCheck(size) if path.name == WEIGHTS_FILE else None
        # A larger config is the store's to refuse by its size; it is not read twice here.
        self._config = bytearray() if path.name == CONFIG_FILE and size <= MAX_CONFIG_SIZE else None

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        self._digest.update(chunk)
        try:
            if self._weights is not None:
                self._weights.update(chunk)
        except InvalidArgument as exc:
            raise _refused(self.path, exc) from None
        if self._config is not None:
            self._config += chunk

    def finish(self) -> LocalFile:
        try:
            if self._weights is not None:
                self._weights.finish()
            if self._config is not None:
                check_config_scale(bytes(self._config))
        except InvalidArgument as exc:
            raise _refused(self.path, exc) from None
        return LocalFile(self.path.name, self.path, self.size, self._digest.hexdigest())


def _refused(path: Path, exc: InvalidArgument) -> UsageError:
    return UsageError(f"{path.parent}: the store would refuse it: {exc.message}")


def hash_files(
    listing: DirectoryListing, progress: Callable[[int], None] | None = None
) -> AdapterFiles:
    """Reads every selected file once, in bounded memory; blocking, so run it in a thread
    (adapterctl uses `push.hash_in_steps`, which Ctrl-C can stop mid-file).
    `progress` gets the byte count of each chunk read."""
    files = []
    for path in listing.selected:
        try:
            with path.open("rb") as f:
                reading = FileReading(path, os.fstat(f.fileno()).st_size)
                while read := read_into(f, reading):
                    if progress is not None:
                        progress(read)
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
        files.append(reading.finish())
    return AdapterFiles(listing.directory, tuple(files), listing.ignored)


def read_into(f: BinaryIO, reading: FileReading) -> int:
    """Reads the next chunk of `f` into `reading`; how many bytes (0 at the end)."""
    chunk = f.read(CHUNK_SIZE)
    reading.update(chunk)
    return len(chunk)


def listing_size(listing: DirectoryListing) -> int:
    total = 0
    for path in listing.selected:
        try:
            total += path.stat().st_size
        except OSError as exc:
            raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    return total
