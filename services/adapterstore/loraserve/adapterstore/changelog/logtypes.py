"""The change log's settings and the types its callers build on.

`ChangeLog` (changelog.py) commits what a `ChangeBuilder` makes, answers a known
idempotency key (`RequestTag`) with the change it made, and backs off between
lost commit races.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from loraserve.adapterstore.catalog import Change, StoreState
from loraserve.common.rpc.backoff import Backoff

# Waits between lost races: replicas that keep colliding spread out instead of
# retrying in lockstep.
CONFLICT_BACKOFF_FIRST_S = 0.005
CONFLICT_BACKOFF_MAX_S = 0.5


def conflict_backoff() -> Backoff:
    return Backoff(CONFLICT_BACKOFF_FIRST_S, CONFLICT_BACKOFF_MAX_S)


@dataclass(frozen=True, slots=True)
class LogSettings:
    poll_interval: float = 0.25  # seconds between looks for other replicas' commits
    snapshot_every: int = 100  # commits between snapshots
    log_retention: int = 10_000  # newest entries always kept; 0 keeps the whole log
    memory_events: int = 10_000  # newest changes kept in memory for watchers

    def __post_init__(self) -> None:
        if self.poll_interval <= 0 or self.snapshot_every < 1 or self.log_retention < 0:
            raise ValueError(f"invalid log settings: {self}")


# Builds the change to commit at `seq` from the freshest state; None means nothing to do.
# It may raise a domain error (NotFound, Aborted...) that the state justifies.
ChangeBuilder = Callable[[StoreState, int], Change | None]


@dataclass(frozen=True, slots=True)
class RequestTag:
    """A client's idempotency key and a digest of what its request asks for."""

    key: str
    digest: str
