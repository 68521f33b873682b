"""The storage format this store writes: the newest that every live store on the
bucket reads, at most `--storage-format`.

Kubernetes' skew policy and etcd's cluster version work the same way: members say
what they run, and the shared data moves up only when the oldest live member can
follow. Here a store learns the others from their announcements (compat/presence.py)
and, for stores of 0.1.0 that make none, from the replicas' signs of life: a store of
0.2.0 or later stamps every sign of life it writes with the format it reads, so a
live sign without one was written by a 0.1.0 store within the status TTL, and the
bucket stays at format 1 until none has been for that long. Until its first look has
succeeded a store writes the oldest format.

Only snapshots differ between formats, and a running store reads a snapshot only
when it starts (or finds a gap), so the window in which a store nobody has seen
could meet a newer format is its own restart: it then refuses to start, by name,
until the newer store writes the older format again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from loraserve.adapterstore.blobs import BlobNotFound, BlobStore
from loraserve.adapterstore.compat.formats import OLDEST_FORMAT, READ_FORMAT
from loraserve.adapterstore.compat.presence import (
    STORE_PREFIX,
    StorePresence,
    new_store_id,
    presence_key,
)
from loraserve.adapterstore.replicas.reads import StatusReader
from loraserve.common.errors import Unavailable

log = logging.getLogger(__name__)

DEFAULT_PRESENCE_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class FormatSettings:
    # The newest storage format this store may write (a downgrade writes an older one).
    storage_format: int = READ_FORMAT
    # Seconds between this store's announcements of itself.
    presence_interval_s: float = DEFAULT_PRESENCE_INTERVAL_S


@dataclass(frozen=True, slots=True)
class BucketReaders:
    """What one look at the bucket found: the newest format every live store reads."""

    stores: tuple[StorePresence, ...]
    # A sign of life written by a store of 0.1.0 within the status TTL.
    unannounced_store: bool

    def common_format(self) -> int:
        if self.unannounced_store:
            return OLDEST_FORMAT
        return min((s.read_format for s in self.stores), default=READ_FORMAT)


class FormatGate:
    """Announces this store and decides, at each look, what it may write."""

    def __init__(
        self, blobs: BlobStore, statuses: StatusReader, settings: FormatSettings, ttl_s: float
    ) -> None:
        self._blobs = blobs
        self._statuses = statuses
        self._settings = settings
        self._ttl = timedelta(seconds=ttl_s)
        self.store_id = new_store_id()
        self._format = OLDEST_FORMAT

    @property
    def write_format(self) -> int:
        """The format to write now: the oldest until the first look succeeds."""
        return self._format

    async def run(self) -> None:
        """Announces and looks every interval until cancelled; then withdraws."""
        try:
            while True:
                try:
                    await self.look()
                except Unavailable as e:
                    log.warning("store.presence_failed error=%s", e.message)
                await asyncio.sleep(self._settings.presence_interval_s)
        finally:
            await asyncio.shield(self._withdraw())

    async def look(self) -> BucketReaders:
        """Announces this store, reads the others, and settles the format to write."""
        me = StorePresence.now(self.store_id, self._settings.presence_interval_s)
        await self._blobs.put(presence_key(self.store_id), me.encode())
        readers = BucketReaders(await self._stores(me.seen_time), await self._unannounced())
        chosen = min(self._settings.storage_format, readers.common_format())
        if chosen != self._format:
            log.info(
                "store.storage_format format=%d was=%d stores=%d unannounced_store=%s",
                chosen,
                self._format,
                len(readers.stores),
                readers.unannounced_store,
            )
        self._format = chosen
        return readers

    async def _stores(self, time: datetime) -> tuple[StorePresence, ...]:
        live, expired = [], []
        for key in await self._blobs.list_keys(STORE_PREFIX):
            try:
                presence = StorePresence.decode(await self._blobs.get(key))
            except BlobNotFound:
                continue  # withdrawn since the listing
            except (ValueError, KeyError, TypeError) as e:
                # A newer store's announcement (it reads more than this one) or a
                # damaged one: neither can hold this store's format down.
                log.debug("store.presence_unreadable key=%s error=%s", key, e)
                continue
            if presence.live_at(time):
                live.append(presence)
            elif time - presence.seen_time > self._ttl:
                expired.append(key)
        if expired:
            await self._blobs.delete(expired)
        return tuple(live)

    async def _unannounced(self) -> bool:
        """Whether a live sign of life was written by a store that does not stamp it.
        Read only until the format has moved up (a look costs a read per replica): a
        0.1.0 store started after that cannot start on the newer snapshots anyway."""
        if self._format > OLDEST_FORMAT or self._settings.storage_format == OLDEST_FORMAT:
            return False
        replicas = await self._statuses.replicas()
        return any(r.seen.store_format == 0 for r in replicas.values())

    async def _withdraw(self) -> None:
        try:
            await self._blobs.delete([presence_key(self.store_id)])
        except Unavailable as e:
            log.warning("store.presence_withdraw_failed error=%s", e.message)
