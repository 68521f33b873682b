"""The store's quotas, handed to what enforces them as the log says, at once.

A QUOTA_CHANGED event takes effect when it is taken in, whatever the adapter's worker
is doing (nothing is loaded for it); a listing replaces every quota (a restarted
replica resumes them from it); a delete drops the adapter's own quota, as the store
does.
"""

from __future__ import annotations

import logging
from typing import Protocol

from loraserve.clients.store import EventKind, Listing, StoreEvent
from loraserve.common.quota import Quota

log = logging.getLogger(__name__)


class QuotaSink(Protocol):
    """Enforces quotas (`serving.QuotaGate`); "" names the default quota."""

    def set_quota(self, name: str, quota: Quota | None) -> None: ...

    def replace_quotas(self, default: Quota | None, own: dict[str, Quota]) -> None: ...


class QuotaFollower:
    def __init__(self, sink: QuotaSink | None) -> None:
        self._sink = sink

    def take_event(self, event: StoreEvent) -> bool:
        """Applies a quota change; True when the event was one (nothing else to do)."""
        if event.kind is EventKind.ADAPTER_DELETED and self._sink is not None:
            self._sink.set_quota(event.name, None)
        if event.kind is not EventKind.QUOTA_CHANGED:
            return False
        log.info(
            "sync.quota seq=%d name=%s quota=%s",
            event.seq,
            event.name or "(default)",
            event.quota.describe() if event.quota is not None else "(cleared)",
        )
        if self._sink is not None:
            self._sink.set_quota(event.name, event.quota)
        return True

    def take_listing(self, listing: Listing) -> None:
        if self._sink is None:
            return
        own = {a.name: a.quota for a in listing.adapters if a.quota is not None}
        self._sink.replace_quotas(listing.default_quota, own)
