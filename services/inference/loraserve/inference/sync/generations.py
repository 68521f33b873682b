"""Which adapters a listing says this replica must forget before it reconciles.

A relist after the watch fell behind cannot see the deletes it missed, only their
traces:

- The store started afresh (its bucket emptied): a different incarnation, or, from a
  store that names none, a head below the seq this replica had reached. Every seq
  and revision number it knew may now name other content (NAME@1 pushed anew), so
  every name it holds anything of is forgotten: routes, loaded and pinned
  revisions, cached files. The listing is then applied as at a first start.
- A name deleted and pushed again: its `create_seq` is past revisions this replica
  still holds of it (loaded, pinned or routed), which belong to the deleted
  generation and no longer exist. That name is forgotten before its new current
  revision is routed.

Forgetting is a delete applied first (`AdapterWish.delete_seq`), exactly as a watched
delete event is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from loraserve.clients.store import Heartbeat, Listing
from loraserve.inference.sync.state import SyncState

log = logging.getLogger(__name__)


def store_restarted(listing: Listing, incarnation: str | None, received_seq: int) -> bool:
    """Whether `listing` comes from another incarnation of the store than the one
    this replica followed (None: it followed none yet)."""
    if incarnation is None:
        return False
    if listing.incarnation and incarnation:
        return listing.incarnation != incarnation
    return listing.seq < received_seq


def names_to_forget(
    listing: Listing,
    *,
    incarnation: str | None,
    received_seq: int,
    known: set[str],
    holds_older_than: Callable[[str, int], bool],
) -> set[str]:
    """The names whose every revision this replica must drop before applying
    `listing`: all it `known`s when the store started afresh, else those deleted and
    pushed again since it last looked."""
    if store_restarted(listing, incarnation, received_seq):
        log.warning(
            "sync.store_restarted incarnation=%s seq=%d was_incarnation=%s was_seq=%d "
            "forgetting=%d: reconciling from the listing",
            listing.incarnation or "-",
            listing.seq,
            incarnation or "-",
            received_seq,
            len(known),
        )
        return set(known)
    reborn = {
        a.name for a in listing.adapters if a.create_seq and holds_older_than(a.name, a.create_seq)
    }
    for name in sorted(reborn):
        log.warning("sync.adapter_reborn name=%s: dropping its deleted generation", name)
    return reborn


def heartbeat_from_elsewhere(heartbeat: Heartbeat, state: SyncState) -> str:
    """Why a watch's heartbeat shows the store started afresh ("" when it does not):
    another incarnation, or a head below the seq this replica received. A store that
    refuses such a watch (OUT_OF_RANGE) never sends one; an older store might."""
    other = heartbeat.incarnation and state.incarnation != heartbeat.incarnation
    if not other and heartbeat.seq >= state.received_seq:
        return ""
    return (
        f"store at seq {heartbeat.seq} of incarnation {heartbeat.incarnation or '-'}, this "
        f"replica at seq {state.received_seq} of {state.incarnation or '-'}; listing again"
    )
