"""The store's yanked revisions, handed to the registry as the log says, at once.

A YANK_CHANGED event takes effect when it is taken in, whatever the adapter's worker
is doing (nothing is loaded for it): from then on the registry refuses the
revision's pins. A listing replaces every yank (a restarted replica resumes them from
it); a delete drops the adapter's, as the store does.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from loraserve.clients.store import EventKind, Listing, StoreEvent
from loraserve.common.revisions.manifest import RevisionKey

log = logging.getLogger(__name__)


class YankSink(Protocol):
    """Refuses the pins of yanked revisions (`AdapterRegistry`)."""

    def set_yanks(self, yanks: Mapping[RevisionKey, str]) -> None:
        """Every yanked revision, with why."""
        ...


class YankFollower:
    def __init__(self, sink: YankSink | None) -> None:
        self._sink = sink
        self._yanks: dict[RevisionKey, str] = {}

    def take_event(self, event: StoreEvent) -> bool:
        """Applies a yank or an unyank; True when the event was one (nothing else to do)."""
        if event.kind is EventKind.ADAPTER_DELETED:
            self._replace({k: r for k, r in self._yanks.items() if k.name != event.name})
        if event.kind is not EventKind.YANK_CHANGED:
            return False
        if event.revision is None:
            log.warning("sync.yank_without_revision seq=%d name=%s", event.seq, event.name)
            return True
        key = event.revision.key
        yanks = dict(self._yanks)
        if event.yank is None:
            yanks.pop(key, None)
        else:
            yanks[key] = event.yank.reason
        log.info("sync.yank seq=%d revision=%s yanked=%s", event.seq, key, event.yank is not None)
        self._replace(yanks)
        return True

    def take_listing(self, listing: Listing) -> None:
        self._replace(
            {
                RevisionKey(adapter.name, yank.revision): yank.reason
                for adapter in listing.adapters
                for yank in adapter.yanks
            }
        )

    def _replace(self, yanks: dict[RevisionKey, str]) -> None:
        if yanks == self._yanks:
            return
        self._yanks = yanks
        if self._sink is not None:
            self._sink.set_yanks(yanks)
