"""`adapterctl push --watch`: publish a revision each time a directory settles.

A change is published once the directory has had no file-system event for the
settle period AND is complete: both required files present, the config parses and
the safetensors file is exactly as long as its header says. So a file still being
written is never published, however slowly it is written; a change that lands while
the files are being hashed starts the wait again. Content identical to the last
published revision is skipped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import grpc
from watchdog.events import (
    EVENT_TYPE_CLOSED,
    EVENT_TYPE_CREATED,
    EVENT_TYPE_DELETED,
    EVENT_TYPE_MODIFIED,
    EVENT_TYPE_MOVED,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from loraserve.adapterctl.adapter_dir import (
    AdapterFiles,
    check_complete,
    list_adapter_dir,
)
from loraserve.adapterctl.commands.push import prepare_push
from loraserve.adapterctl.failures import UsageError
from loraserve.adapterctl.terminal.console import Console
from loraserve.common.errors import InvalidArgument, error_from_rpc

Fingerprint = tuple[tuple[str, int, str], ...]

# Writes, not reads: hashing the files must not count as a change.
_CHANGE_EVENTS = frozenset(
    {
        EVENT_TYPE_CREATED,
        EVENT_TYPE_DELETED,
        EVENT_TYPE_MODIFIED,
        EVENT_TYPE_MOVED,
        EVENT_TYPE_CLOSED,
    }
)
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
_FATAL = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})
_RETRY_FIRST_S = 1.0
_RETRY_MAX_S = 30.0


class Publisher(Protocol):
    """Where settled directory states go; the store in production, a list in unit tests."""

    async def last_published(self) -> tuple[str, Fingerprint] | None:
        """The reference (`NAME@REV`) and content of what is current now, if anything."""
        ...

    async def publish(self, files: AdapterFiles) -> str:
        """Publishes one revision and returns its `NAME@REV`; raises AioRpcError."""
        ...


class ChangeSignal(FileSystemEventHandler):
    """Carries watchdog's events from its observer thread into the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self.generation = 0

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _CHANGE_EVENTS:
            self._loop.call_soon_threadsafe(self.bump)

    def bump(self) -> None:
        self.generation += 1
        self._event.set()

    def bump_later(self, delay_s: float) -> None:
        self._loop.call_later(delay_s, self.bump)

    async def next_change(self) -> None:
        await self._event.wait()
        self._event.clear()

    async def settled(self, settle_s: float) -> None:
        """Returns once `settle_s` seconds pass without a change."""
        while True:
            self._event.clear()
            try:
                # Not wait_for: on Python 3.11 it drops a cancel (Ctrl-C) that lands
                # just as a change does, and the watch would go on.
                async with asyncio.timeout(settle_s):
                    await self._event.wait()
            except TimeoutError:
                return


class SettledPusher:
    """Decides, for each settled state of the directory, whether to publish it."""

    def __init__(
        self,
        name: str,
        directory: Path,
        publisher: Publisher,
        console: Console,
        signal: ChangeSignal,
        prepare: Callable[[Path, Console], Awaitable[AdapterFiles]] = prepare_push,
    ) -> None:
        self._name = name
        self._directory = directory
        self._publisher = publisher
        self._console = console
        self._signal = signal
        self._prepare = prepare
        self._last: tuple[str, Fingerprint] | None = None
        self._retry_s = _RETRY_FIRST_S

    async def run(self, settle_s: float) -> None:
        """Publishes the directory as it is, then every settled change, until cancelled."""
        self._last = await self._publisher.last_published()
        await self.attempt()
        while True:
            await self._signal.next_change()
            await self._signal.settled(settle_s)
            await self.attempt()

    async def attempt(self) -> None:
        generation = self._signal.generation
        try:
            listing = await asyncio.to_thread(list_adapter_dir, self._directory)
            await asyncio.to_thread(check_complete, listing)
            files = await self._prepare(self._directory, self._console)
        except (UsageError, InvalidArgument) as exc:
            self._console.err(
                f"not pushing {self._name}: {exc.args[0]}; waiting for the next change"
            )
            return
        if self._signal.generation != generation:
            return  # Changed while hashing: the pending change gets its own settle period.
        fingerprint = files.fingerprint()
        if self._last is not None and self._last[1] == fingerprint:
            self._console.err(f"{self._name} unchanged since {self._last[0]}; not pushed")
            return
        try:
            ref = await self._publisher.publish(files)
        except grpc.aio.AioRpcError as exc:
            self._report_failure(exc)
            return
        self._retry_s = _RETRY_FIRST_S
        self._last = (ref, fingerprint)
        self._console.out(ref)

    def _report_failure(self, exc: grpc.aio.AioRpcError) -> None:
        error = error_from_rpc(exc)
        if error.code in _FATAL:
            raise exc
        line = f"push of {self._name} failed: {error.code.name}: {error.message}"
        if error.code in _RETRYABLE:
            self._console.err(f"{line}; retrying in {self._retry_s:g} s")
            self._signal.bump_later(self._retry_s)
            self._retry_s = min(self._retry_s * 2, _RETRY_MAX_S)
        else:
            self._console.err(f"{line}; waiting for the next change")


async def watch_directory(
    name: str, directory: Path, publisher: Publisher, console: Console, settle_s: float
) -> None:
    """Watches `directory` and publishes its settled states until cancelled."""
    if not await asyncio.to_thread(directory.is_dir):
        raise UsageError(f"{directory}: no such directory")
    signal = ChangeSignal(asyncio.get_running_loop())
    observer: Any = Observer()
    observer.schedule(signal, str(directory), recursive=False)
    observer.start()
    try:
        console.err(f"watching {directory} for {name} (settle {settle_s:g} s); Ctrl-C to stop")
        await SettledPusher(name, directory, publisher, console, signal).run(settle_s)
    finally:
        observer.stop()
        await asyncio.to_thread(observer.join)
