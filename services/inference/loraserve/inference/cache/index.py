"""The disk tier's index: which revisions the cache holds, their bytes, and when each
was last used, least recently used first.

It decides what the byte bound evicts and what a restarted replica prefetches (the
adapters it served most recently), so it outlives the process: it is written to
`<cache>/.index.json` (a temporary file renamed into place, so a crash leaves the
old index or the new one, never half of one) at most once per `persist_interval_s`
and on close. The disk stays the truth: a restart indexes the revision directories
it finds, in the saved order, and a directory the index does not know counts as
used longest ago. Pure bookkeeping plus that one file; `AdapterCache` owns the
revision directories themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from loraserve.common.revisions.manifest import RevisionKey

log = logging.getLogger(__name__)

INDEX_FILE = ".index.json"
_FORMAT = 1
# The index file's size, bounded from above: its header, and per revision the name
# plus the longest revision number, size and time JSON can write.
_FILE_BYTES = 64
_ENTRY_BYTES = 80


@dataclass
class IndexedRevision:
    """One revision on disk: its bytes and its last use (Unix seconds)."""

    size: int
    last_used: float


class CacheIndex:
    """Revisions on disk in least-recently-used order, with their total bytes."""

    def __init__(self, root: Path, persist_interval_s: float = 2.0) -> None:
        self._path = root / INDEX_FILE
        self._persist_interval_s = persist_interval_s
        self._save: asyncio.Task[None] | None = None
        self._entries: OrderedDict[RevisionKey, IndexedRevision] = OrderedDict()
        self.bytes = 0
        self._entry_bytes = 0
        self._dirty = False

    @property
    def disk_bytes(self) -> int:
        """What the indexed revisions and this index take on disk (at most)."""
        return self.bytes + _FILE_BYTES + self._entry_bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def lru(self) -> Iterator[RevisionKey]:
        """Keys, least recently used first (a copy: callers may change the index)."""
        return iter(list(self._entries))

    def revisions_of(self, name: str) -> list[int]:
        return [rev for (n, rev) in self._entries if n == name]

    def add(self, key: RevisionKey, size: int) -> None:
        """A revision committed to disk: the most recently used one."""
        self.discard(key)
        self._entries[key] = IndexedRevision(size, time.time())
        self.bytes += size
        self._entry_bytes += len(key[0]) + _ENTRY_BYTES
        self._dirty = True

    def touch(self, key: RevisionKey) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.last_used = time.time()
            self._entries.move_to_end(key)
            self._dirty = True

    def discard(self, key: RevisionKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= entry.size
            self._entry_bytes -= len(key[0]) + _ENTRY_BYTES
            self._dirty = True

    def recent_names(self) -> list[str]:
        """Adapter names, the most recently used first, each once."""
        seen: dict[str, None] = {}
        for name, _ in reversed(self._entries):
            seen.setdefault(name)
        return list(seen)

    def rebuild(self, found: Iterable[tuple[RevisionKey, int]]) -> None:
        """Indexes the revisions found on disk (key, bytes), ordered as the saved index
        last ordered them; revisions it did not know count as used longest ago."""
        saved = self._read()
        entries = [(key, IndexedRevision(size, saved.get(key, 0.0))) for key, size in found]
        entries.sort(key=lambda item: item[1].last_used)
        self._entries = OrderedDict(entries)
        self.bytes = sum(entry.size for _, entry in entries)
        self._entry_bytes = sum(len(name) + _ENTRY_BYTES for (name, _), _ in entries)
        self._dirty = True

    def save_soon(self) -> None:
        """Writes the index within `persist_interval_s`: touches come with every
        request, writes at most that often."""
        if self._save is None or self._save.done():
            self._save = asyncio.get_running_loop().create_task(self._save_later())

    async def close(self) -> None:
        """Writes the index now (shutdown)."""
        if self._save is not None:
            self._save.cancel()
            await asyncio.gather(self._save, return_exceptions=True)
        await asyncio.to_thread(self.save_if_changed)

    async def _save_later(self) -> None:
        await asyncio.sleep(self._persist_interval_s)
        await asyncio.to_thread(self.save_if_changed)

    def save_if_changed(self) -> None:
        """Writes the index if it changed since the last write (blocking I/O)."""
        if not self._dirty:
            return
        self._dirty = False
        document = {
            "format": _FORMAT,
            "revisions": [
                [name, revision, entry.size, entry.last_used]
                for (name, revision), entry in self._entries.items()
            ],
        }
        temporary = self._path.with_name(f"{INDEX_FILE}.{os.getpid()}.tmp")
        try:
            temporary.write_text(json.dumps(document), "utf-8")
            os.replace(temporary, self._path)
        except OSError as exc:
            # The index only orders evictions and prefetches; serving goes on without it.
            self._dirty = True
            log.warning("cache.index_write_failed reason=%s", exc)

    def _read(self) -> dict[RevisionKey, float]:
        try:
            document = json.loads(self._path.read_text("utf-8"))
            if document.get("format") != _FORMAT:
                raise ValueError(f"unknown index format {document.get('format')!r}")
            return {
                RevisionKey(str(name), int(revision)): float(last_used)
                for name, revision, _size, last_used in document["revisions"]
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("cache.index_unreadable reason=%s; ordering by what is on disk", exc)
            return {}
