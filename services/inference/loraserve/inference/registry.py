"""Which adapter revisions are loaded in the engine, and where each adapter name routes.

Hot-swap is make-before-break. Every (name, revision) is its own engine adapter, named
`"<name>@<revision>"` with a `lora_int_id` never used before on the engine, and never
loaded in place. A new revision is loaded beside the old one; only after the engine
accepted it does the name's route flip, in one synchronous step. The old revision
then drains: requests already on it finish there, and once it has none in flight and
is neither current nor pinned it is removed from the engine and its files deleted
(vLLM may re-read an adapter's path until it is removed). Getting one revision into
the engine and out again is `engine_adapters`; this module keeps the states and routes.

`name@revision` requests pin that revision: it is fetched through the
`RevisionFetcher` and loaded on demand, and kept in a bounded LRU of pinned revisions.

A delete wins over every load of that name still in flight: the load's result is
discarded (never routed or pinned, its files removed) and its callers get NOT_FOUND,
so a revision the store no longer has cannot become servable after the delete. A
load that fails for any reason leaves no files behind either.

The seam with the sync side (inference-sync):

    install(rev, make_current=...)   load a fetched revision; route it or pin it
    record_failure(name, rev, ...)   a revision that could not even be fetched
    set_current(name, revision)      rollback/promote (fetches if no longer loaded)
    delete(name)                     unroute; every revision drains, then goes;
                                     loads in flight are discarded
    current_revision(name), is_installed(name, revision), holds(...), snapshot()
    settle()                         waits for removals in progress (tests, shutdown)

Both sides never load a path that is not inside the adapter cache directory.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from loraserve.common.errors import LoraserveError, NotFound, Unavailable
from loraserve.common.names import AdapterRef
from loraserve.inference.compat import AdapterFacts, CompatibilityChecker
from loraserve.inference.engine import AdapterHandle, Engine
from loraserve.inference.engine_adapters import EngineAdapters

log = logging.getLogger(__name__)

Key = tuple[str, int]


@dataclass(frozen=True)
class LocalRevision:
    """A revision fully present in the local cache, verified."""

    name: str
    revision: int
    path: Path  # cache/<name>/<revision>/, inside the adapter cache dir
    rank: int
    target_modules: tuple[str, ...]
    base_model: str


class RevisionFetcher(Protocol):
    """Makes a revision present in the local cache (implemented by the sync side)."""

    async def fetch(self, name: str, revision: int) -> LocalRevision:
        """Raises NotFound, DataLoss or Unavailable."""
        ...


class LoadFailureListener(Protocol):
    def adapter_load_failed(self, name: str) -> None: ...


class AdapterState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


@dataclass(frozen=True)
class RevisionStatus:
    """One revision as ListAdapters reports it."""

    name: str
    revision: int
    state: AdapterState
    current: bool
    in_flight: int = 0
    lora_int_id: int = 0
    rank: int = 0
    last_error: str = ""


@dataclass(frozen=True)
class Lease:
    """What a request runs on; `adapter` is None for the base model."""

    name: str
    revision: int
    adapter: AdapterHandle | None


@dataclass
class _Loaded:
    rev: LocalRevision
    handle: AdapterHandle
    in_flight: int = 0


class AdapterRegistry:
    """Routes adapter names to loaded revisions on the engine; make-before-break."""

    def __init__(
        self,
        engine: Engine,
        *,
        cache_dir: Path,
        compat: CompatibilityChecker,
        fetcher: RevisionFetcher | None = None,
        max_pinned: int = 8,
        failures: LoadFailureListener | None = None,
    ) -> None:
        if max_pinned < 1:
            raise ValueError(f"max_pinned must be at least 1, got {max_pinned}")
        self._adapters = EngineAdapters(engine, cache_dir, compat, self._spawn)
        self._fetcher = fetcher
        self._max_pinned = max_pinned
        self._failures = failures
        self._loaded: dict[Key, _Loaded] = {}
        self._routes: dict[str, int] = {}
        self._pinned: OrderedDict[Key, None] = OrderedDict()
        # A key is busy while it loads or is removed; others wait for the event.
        self._busy: dict[Key, asyncio.Event] = {}
        self._loading: dict[Key, int] = {}  # key -> rank, 0 while unknown
        # Loads in flight whose name was deleted since they started: discarded.
        self._deleted_while_loading: set[Key] = set()
        self._removing: dict[Key, _Loaded] = {}
        self._failed: dict[Key, tuple[int, str]] = {}  # key -> (rank, error)
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the sync side ---------------------------------------------------------------

    async def install(self, rev: LocalRevision, *, make_current: bool) -> None:
        """Loads `rev` (if not loaded yet), then routes its name to it or pins it.

        Raises FailedPrecondition if the revision is incompatible or the engine
        rejects it; whatever was serving before keeps serving.
        """
        key = (rev.name, rev.revision)
        try:
            entry = await self._ensure_loaded(key, functools.partial(self._obtain, key, rev))
        except LoraserveError as exc:
            self._failed[key] = (rev.rank, exc.message)
            if self._failures is not None:
                self._failures.adapter_load_failed(rev.name)
            raise
        if make_current:
            self._route(entry)
        else:
            self._pin(key)

    def record_failure(self, name: str, revision: int, rank: int, message: str) -> None:
        """A revision that failed before it reached `install` (refused from its manifest,
        corrupt download): listed as FAILED with the reason, like a failed load."""
        key = (name, revision)
        if key in self._loaded or key in self._loading:
            return
        self._failed[key] = (rank, message)
        if self._failures is not None:
            self._failures.adapter_load_failed(name)

    async def set_current(self, name: str, revision: int) -> None:
        """Routes `name` to `revision`, loading it again if it was already removed."""
        key = (name, revision)
        entry = await self._ensure_loaded(key, functools.partial(self._obtain, key, None))
        self._route(entry)

    async def delete(self, name: str) -> None:
        """Stops routing `name`; its revisions drain, then leave the engine."""
        self._routes.pop(name, None)
        for key in [k for k in self._pinned if k[0] == name]:
            del self._pinned[key]
        for key in [k for k in self._failed if k[0] == name]:
            del self._failed[key]
        self._deleted_while_loading.update(k for k in self._loading if k[0] == name)
        for key in [k for k in self._loaded if k[0] == name]:
            self._maybe_retire(key)
        log.info("adapter.unrouted name=%s", name)

    def current_revision(self, name: str) -> int | None:
        return self._routes.get(name)

    def is_installed(self, name: str, revision: int) -> bool:
        return (name, revision) in self._loaded

    def holds(self, name: str, revision: int) -> bool:
        """Whether the revision's files are in use: loaded, loading or being removed."""
        key = (name, revision)
        return key in self._loaded or key in self._loading or key in self._removing

    async def settle(self) -> None:
        """Waits until every removal started so far has finished."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the request side ------------------------------------------------------------

    @asynccontextmanager
    async def acquire(self, ref: AdapterRef) -> AsyncIterator[Lease]:
        """Holds the revision `ref` resolves to for the duration of a request."""
        if ref.is_base:
            yield Lease(name="", revision=0, adapter=None)
            return
        if ref.revision is None:
            entry = self._current_entry(ref.name)
        else:
            key = (ref.name, ref.revision)
            entry = await self._ensure_loaded(key, functools.partial(self._obtain, key, None))
            self._pin(key)
        key = (entry.rev.name, entry.rev.revision)
        entry.in_flight += 1
        try:
            yield Lease(name=entry.rev.name, revision=entry.rev.revision, adapter=entry.handle)
        finally:
            entry.in_flight -= 1
            self._maybe_retire(key)

    def loaded_count(self) -> int:
        return len(self._loaded) + len(self._removing)

    def snapshot(self) -> list[RevisionStatus]:
        """Every revision this registry knows, ordered by name then revision."""
        statuses: dict[Key, RevisionStatus] = {}
        for key, (rank, error) in self._failed.items():
            statuses[key] = RevisionStatus(
                *key, AdapterState.FAILED, current=False, rank=rank, last_error=error
            )
        for key, rank in self._loading.items():
            statuses[key] = RevisionStatus(*key, AdapterState.LOADING, current=False, rank=rank)
        for key, entry in [*self._removing.items(), *self._loaded.items()]:
            current = self._routes.get(key[0]) == key[1]
            serving = key in self._loaded and (current or key in self._pinned)
            statuses[key] = RevisionStatus(
                *key,
                state=AdapterState.READY if serving else AdapterState.DRAINING,
                current=current,
                in_flight=entry.in_flight,
                lora_int_id=entry.handle.lora_int_id,
                rank=entry.rev.rank,
            )
        return [statuses[key] for key in sorted(statuses)]

    # -- internals ---------------------------------------------------------------------

    def _current_entry(self, name: str) -> _Loaded:
        revision = self._routes.get(name)
        if revision is None:
            if any(key[0] == name for key in self._loading):
                raise Unavailable(f"adapter {name!r} is still loading; retry shortly")
            raise NotFound(f"adapter {name!r} is not served here")
        return self._loaded[(name, revision)]

    async def _obtain(self, key: Key, given: LocalRevision | None) -> LocalRevision:
        # A revision's files are deleted when it leaves the engine; one asked for again
        # after that (a rollback, a pin) is fetched again.
        if given is not None and given.path.is_dir():
            return given
        if self._fetcher is None:
            raise NotFound(f"adapter {key[0]}@{key[1]} is not loaded here")
        return await self._fetcher.fetch(*key)

    async def _ensure_loaded(
        self, key: Key, obtain: Callable[[], Awaitable[LocalRevision]]
    ) -> _Loaded:
        while (entry := self._loaded.get(key)) is None:
            busy = self._busy.get(key)
            if busy is None:
                return await self._load(key, obtain)
            await busy.wait()
        return entry

    async def _load(self, key: Key, obtain: Callable[[], Awaitable[LocalRevision]]) -> _Loaded:
        done = asyncio.Event()
        self._busy[key] = done
        self._loading[key] = 0
        rev: LocalRevision | None = None
        added: AdapterHandle | None = None
        try:
            rev = await obtain()
            self._loading[key] = rev.rank
            self._check_not_deleted(key)
            await self._adapters.check(
                AdapterFacts(rev.name, rev.revision, rev.rank, rev.target_modules, rev.base_model),
                rev.path,
            )
            handle = self._adapters.handle(rev.name, rev.revision, rev.path)
            await self._adapters.add(handle)
            added = handle
            self._check_not_deleted(key)
            entry = _Loaded(rev, handle)
            self._loaded[key] = entry
            self._failed.pop(key, None)
            log.info("adapter.loaded name=%s rev=%d lora_int_id=%d", *key, handle.lora_int_id)
            # Returned before the waiters run: the caller routes or pins it first, so a
            # fresh revision is never seen unclaimed and retired.
            return entry
        except Exception:
            await self._adapters.discard(rev.path if rev is not None else None, added)
            raise
        finally:
            del self._busy[key]
            del self._loading[key]
            self._deleted_while_loading.discard(key)
            done.set()

    def _check_not_deleted(self, key: Key) -> None:
        if key in self._deleted_while_loading:
            log.info("adapter.load_discarded name=%s rev=%d: deleted while loading", *key)
            raise NotFound(f"adapter {key[0]}@{key[1]} was deleted")

    def _route(self, entry: _Loaded) -> None:
        name, revision = entry.rev.name, entry.rev.revision
        previous = self._routes.get(name)
        self._routes[name] = revision
        log.info(
            "adapter.routed name=%s rev=%d lora_int_id=%d previous=%s",
            name,
            revision,
            entry.handle.lora_int_id,
            previous,
        )
        if previous is not None and previous != revision:
            self._maybe_retire((name, previous))

    def _pin(self, key: Key) -> None:
        self._pinned[key] = None
        self._pinned.move_to_end(key)
        while len(self._pinned) > self._max_pinned:
            evicted, _ = self._pinned.popitem(last=False)
            self._maybe_retire(evicted)

    def _maybe_retire(self, key: Key) -> None:
        entry = self._loaded.get(key)
        if (
            entry is None
            or entry.in_flight
            or self._routes.get(key[0]) == key[1]
            or key in self._pinned
        ):
            return
        del self._loaded[key]
        self._removing[key] = entry
        done = asyncio.Event()
        self._busy[key] = done
        self._spawn(self._remove(key, entry, done))

    async def _remove(self, key: Key, entry: _Loaded, done: asyncio.Event) -> None:
        try:
            await self._adapters.remove(entry.handle, entry.rev.path)
            log.info(
                "adapter.removed name=%s rev=%d lora_int_id=%d", *key, entry.handle.lora_int_id
            )
        except Exception:
            # A background task has no caller to tell; the id is never reused, so a
            # leftover adapter in the engine costs memory only, never correctness.
            log.exception("adapter.remove_failed name=%s rev=%d", *key)
        finally:
            del self._removing[key]
            del self._busy[key]
            done.set()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
