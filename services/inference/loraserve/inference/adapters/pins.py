"""Pinned requests (`NAME@REV`): which the pin policy serves, and how pins share the
engine.

Invariants: a pin is refused before anything is loaded for it: a caller whose token
is not a pinner's (PERMISSION_DENIED), every pin under policy `off` (the same), a
yanked revision (FAILED_PRECONDITION, with the store's reason), and under `rollout`
any revision but the name's current one and its active rollout's candidate
(FAILED_PRECONDITION). The current revision and the candidate run as their route and
rollout arm hold them, so pinning them takes no pin place and evicts nothing. Any
other revision (policy `any` only) takes one of `max_pinned` places, least recently
used first out; a place whose revision ran a request within `idle_s`, or runs one
now, is never taken from it, so a caller cycling through revisions cannot push out a
revision another caller is using: once every place is in such use, a new pin is
RESOURCE_EXHAUSTED until one falls idle.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from loraserve.common.config.pins import PinPolicy, PinSettings
from loraserve.common.errors import (
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from loraserve.common.revisions.manifest import Revision, RevisionKey
from loraserve.common.rpc.security import Role, current_role
from loraserve.inference.adapters.arms import CandidateArms
from loraserve.inference.adapters.loads import Claim, RevisionLoads
from loraserve.inference.adapters.state import RevisionEntry, RevisionLife

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PinParts:
    """What of the registry pins read and drive; the registry owns all of it."""

    entries: dict[RevisionKey, RevisionEntry]
    targets: dict[str, Revision]
    loads: RevisionLoads
    arms: CandidateArms
    # The entry the name routes to, if any.
    routed: Callable[[str], RevisionEntry | None]
    # Routes a loaded revision that is still its name's target.
    route_if_target: Claim
    update: Callable[[RevisionEntry], None]


class Pins:
    """Serves pinned requests as the policy says; see the module docstring."""

    def __init__(
        self, settings: PinSettings, parts: PinParts, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self._parts = parts
        self._clock = clock
        self._stamps = itertools.count(1)
        # Yanked revisions, with the store's reason: never served pinned.
        self._yanks: dict[RevisionKey, str] = {}

    async def entry_for(self, key: RevisionKey) -> RevisionEntry:
        """The revision a request pinned, READY or DRAINING in the engine; refuses
        what the policy does not serve (see the module docstring)."""
        parts = self._parts
        split = parts.arms.splits.get(key.name)
        target = parts.targets.get(key.name)
        self._check(key, target, split.candidate.revision if split is not None else None)
        routed = parts.routed(key.name)
        if routed is not None and routed.revision == key.revision:
            return routed
        held: RevisionEntry | None = None
        if split is not None and split.candidate.key == key:
            held = await self._candidate(key)
        elif target is not None and target.key == key:
            held = await parts.loads.ensure_loaded(key, target, parts.route_if_target)
        if held is not None and held.state in (RevisionLife.READY, RevisionLife.DRAINING):
            return held
        if self.settings.policy is not PinPolicy.ANY:
            raise Unavailable(f"{key} stopped being current or a candidate as it loaded; retry")
        self._check_room(key)
        pinned = await parts.loads.ensure_loaded(key, None, self.claim)
        if pinned is None:
            raise Unavailable(f"adapter {key} left as it loaded; retry")
        return pinned

    async def _candidate(self, key: RevisionKey) -> RevisionEntry | None:
        """The rollout's candidate, loaded as its arm loads it when it is not in the
        engine yet (its arm then reports it)."""
        entry = self._parts.entries.get(key)
        if entry is None or entry.state is not RevisionLife.READY:
            await self._parts.arms.install(key.name)
            entry = self._parts.entries.get(key)
        return entry

    def claim(self, entry: RevisionEntry) -> None:
        """Pins a revision in the engine (a pinned request's, or one sync loads ahead),
        then evicts the least recently used pins beyond `max_pinned` that may go."""
        entry.pinned_at = next(self._stamps)
        entry.pin_used_at = self._clock()
        self._parts.update(entry)
        pinned = sorted(
            (e for e in self._parts.entries.values() if e.pinned_at and e is not entry),
            key=lambda e: e.pinned_at,
        )
        excess = len(pinned) + 1 - self.settings.max_pinned
        for evicted in [e for e in pinned if self._evictable(e)][: max(0, excess)]:
            evicted.pinned_at = 0
            self._parts.update(evicted)

    def set_yanks(self, yanks: Mapping[RevisionKey, str]) -> None:
        """The store's yanked revisions, all of them: each is refused from now on, and
        one pinned here loses its pin (requests on it finish first)."""
        self._yanks = dict(yanks)
        for entry in list(self._parts.entries.values()):
            if entry.pinned_at and entry.key in self._yanks:
                entry.pinned_at = 0
                self._parts.update(entry)
                log.info("adapter.pin_dropped name=%s rev=%d: yanked", *entry.key)

    def _check(self, key: RevisionKey, target: Revision | None, candidate: int | None) -> None:
        role = current_role.get()
        if role is not None and role is not Role.PINNER:
            raise PermissionDenied(
                f"pinning needs a pinner token: {key} was asked with a {role.name.lower()} "
                f"token; ask for {key.name} instead"
            )
        policy = self.settings.policy
        if policy is PinPolicy.OFF:
            raise PermissionDenied(
                f"{key}: this server serves no pinned revisions (pin policy 'off'); "
                f"ask for {key.name} instead"
            )
        reason = self._yanks.get(key)
        if reason is not None:
            raise FailedPrecondition(f"{key} is yanked: {reason}")
        if policy is not PinPolicy.ROLLOUT or key.revision == candidate:
            return
        if target is None:
            raise NotFound(f"adapter {key.name!r} is not served here")
        if key.revision != target.revision:
            raise FailedPrecondition(
                f"{key} is neither the current revision of {key.name} ({target.revision}) "
                "nor its rollout's candidate: the pin policy 'rollout' serves only those; "
                f"ask for {key.name} instead"
            )

    def _check_room(self, key: RevisionKey) -> None:
        """Refuses a pin that would need a place when every place is in use."""
        pinned = [e for e in self._parts.entries.values() if e.pinned_at]
        if (
            len(pinned) < self.settings.max_pinned
            or any(e.key == key for e in pinned)
            or any(self._evictable(e) for e in pinned)
        ):
            return
        raise ResourceExhausted(
            f"{key}: all {self.settings.max_pinned} places for pinned revisions hold "
            f"revisions used within the last {self.settings.idle_s:g} s; ask again later, "
            f"or for {key.name} instead"
        )

    def _evictable(self, entry: RevisionEntry) -> bool:
        """Whether a pin may lose its place: nothing runs or waits on it, and it has
        been idle `idle_s`."""
        return (
            not entry.in_flight
            and not entry.waiters
            and self._clock() - entry.pin_used_at >= self.settings.idle_s
        )
