"""Applying what the store asked for of one adapter to the registry: a revision to
route or load, a rollout's split, a delete.

Invariants: a permanent failure is listed FAILED in the registry with its reason (a
NACK in the next report) and remembered as rejected, so it is not tried again until
an event asks for it again; a transient failure (TRANSIENT_ERRORS) propagates for
the caller to retry; at most `max_concurrent_loads` loads run at once; every name
touched is marked for the reporter (reports.py), which tells the store what came of
it. What came of each is kept in `state`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from loraserve.clients.store import RolloutSplit
from loraserve.common import errors
from loraserve.common.errors import TRANSIENT_ERRORS
from loraserve.common.fleet.reports import AdapterReport
from loraserve.common.revisions.manifest import Revision
from loraserve.inference.adapters import RegistryCounts
from loraserve.inference.sync.state import SyncState

log = logging.getLogger(__name__)


class Registry(Protocol):
    """What sync drives of the registry (`AdapterRegistry`, or a fake)."""

    async def install(self, manifest: Revision, *, make_current: bool) -> None:
        """Fetches and loads the revision, then routes its name to it or pins it."""
        ...

    def set_target(self, manifest: Revision) -> None:
        """Routes the name to `manifest` without loading it; FailedPrecondition if this
        server could not serve it."""
        ...

    async def set_current(self, name: str, revision: int) -> None: ...

    async def delete(self, name: str) -> None: ...

    def current_revision(self, name: str) -> int | None: ...

    def target_revision(self, name: str) -> int | None: ...

    def is_loaded(self, name: str, revision: int) -> bool: ...

    def uses_files(self, name: str, revision: int) -> bool: ...

    def is_resident(self, name: str) -> bool: ...

    def counts(self) -> RegistryCounts: ...

    def held(self) -> dict[str, int]:
        """Every name it holds anything of (route, target, loaded or pinned
        revision), with the lowest store seq among those revisions' manifests."""
        ...

    def mark_failed(self, manifest: Revision, error: Exception) -> None:
        """Lists the revision FAILED with the reason (the store sees a NACK)."""
        ...

    def set_rollout(self, name: str, split: RolloutSplit) -> None:
        """Splits the name's requests; FailedPrecondition if the candidate cannot run here."""
        ...

    def end_rollout(self, name: str) -> None: ...

    async def install_candidate(self, name: str) -> None: ...

    def split_of(self, name: str) -> RolloutSplit | None: ...

    def report(self, name: str) -> AdapterReport | None:
        """What the store should be told of the name (reports.py)."""
        ...

    def names(self) -> set[str]: ...


SwapObserver = Callable[[float], None]
"""Called with the seconds from event received to route flipped (metrics' swap latency)."""


class RevisionApplier:
    """Routes, loads and deletes what the store asks for, and reports the outcome."""

    def __init__(
        self,
        registry: Registry,
        state: SyncState,
        mark: Callable[[str], None],
        max_concurrent_loads: int,
        observe_swap: SwapObserver | None,
    ) -> None:
        self._registry = registry
        self._state = state
        # The name's report may have changed.
        self._mark = mark
        self._observe_swap = observe_swap
        self._load_limit = asyncio.Semaphore(max_concurrent_loads)
        # Names with a load in progress here (not yet in the registry while fetching).
        self.loading: set[str] = set()

    def wants(self, target: Revision) -> bool:
        if target.key in self._state.rejected:
            return False
        return self._registry.current_revision(target.adapter_name) != target.revision

    async def route(self, manifest: Revision) -> None:
        """Routes the name to a revision without loading it (its first request will),
        once its manifest shows this server can serve it."""
        name, revision = manifest.adapter_name, manifest.revision
        try:
            self._registry.set_target(manifest)
        except Exception as exc:
            self._reject(manifest, exc)
            return
        self._state.served.add(name)
        self._mark(name)
        log.info("adapter.routed_lazily name=%s rev=%d", name, revision)

    async def preload(self, manifest: Revision) -> None:
        """Loads a non-current revision once, so promoting it later is quick."""
        key = manifest.key
        if key in self._state.preloaded or self._registry.is_loaded(*key):
            return
        await self.serve(manifest, make_current=False, seen_at=None)
        self._state.preloaded.add(key)

    async def serve(self, manifest: Revision, *, make_current: bool, seen_at: float | None) -> None:
        """Loads a revision (routing it if asked) and reports the outcome; transient
        failures propagate to be retried, permanent ones are NACKed here."""
        name, revision = manifest.adapter_name, manifest.revision
        self.loading.add(name)
        try:
            async with self._load_limit:
                if self._registry.is_loaded(name, revision):
                    if make_current:
                        await self._registry.set_current(name, revision)
                else:
                    await self._registry.install(manifest, make_current=make_current)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            self._reject(manifest, exc)
            return
        finally:
            self.loading.discard(name)
            self._mark(name)
        self._state.served.add(name)
        if make_current and seen_at is not None:
            latency = time.monotonic() - seen_at
            log.info("adapter.routed name=%s rev=%d swap_s=%.3f", name, revision, latency)
            if self._observe_swap is not None:
                self._observe_swap(latency)
        else:
            log.info("adapter.loaded name=%s rev=%d current=%s", name, revision, make_current)

    async def split(self, name: str, rollout: RolloutSplit | None) -> None:
        """Applies the adapter's rollout: its split, the candidate loaded ahead when
        the adapter is in the engine; the split ends when `rollout` is None. A
        candidate that cannot run here is listed FAILED (the split then sends every
        request to the current revision)."""
        if rollout is None:
            if self._registry.split_of(name) is not None:
                self._registry.end_rollout(name)
                log.info("rollout.ended name=%s", name)
            return
        try:
            self._registry.set_rollout(name, rollout)
            if self._registry.is_resident(name):
                async with self._load_limit:
                    await self._registry.install_candidate(name)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:
            self._reject(rollout.candidate, exc)
            return
        finally:
            self._mark(name)
        log.info(
            "rollout.split name=%s candidate=%d weight=%g",
            name,
            rollout.candidate.revision,
            rollout.weight,
        )

    async def delete(self, name: str) -> None:
        served = self._serving_revision(name)
        await self._registry.delete(name)
        self._state.forget(name)
        self._mark(name)
        log.info("adapter.deleted name=%s rev=%d", name, served)

    def _reject(self, manifest: Revision, exc: Exception) -> None:
        name, revision = manifest.adapter_name, manifest.revision
        self._state.rejected.add(manifest.key)
        if isinstance(exc, errors.LoraserveError):
            message = exc.message
            log.warning(
                "adapter.rejected name=%s rev=%d code=%s reason=%s",
                name,
                revision,
                exc.code.name,
                message,
            )
        else:
            # A bug of ours or an engine error we did not foresee: report it and keep
            # syncing the other adapters rather than stopping.
            log.error("adapter.load_bug name=%s rev=%d", name, revision, exc_info=exc)
            exc = errors.Internal(f"internal error loading the revision: {type(exc).__name__}")
        self._registry.mark_failed(manifest, exc)
        self._mark(name)

    def _serving_revision(self, name: str) -> int:
        return self._registry.current_revision(name) or 0
